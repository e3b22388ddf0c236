//! Piecewise-cubic, C1 Clough-Tocher interpolation on a Delaunay triangulation, with the same
//! gradient estimation as scipy's `CloughTocher2DInterpolator` (global curvature minimisation,
//! Nielson 1983 / Renka and Cline 1984) and its affine-invariant choice of cross-boundary
//! derivative directions, so `griddata(method="cubic")` results are reproduced.
//!
//! The triangulation comes from `spade` (robust predicates). Outside the convex hull the
//! interpolant is undefined (`None`), as scipy's is NaN.

use spade::{DelaunayTriangulation, HasPosition, Point2, Triangulation};

/// Gauss-Seidel iterations and tolerance of scipy's gradient estimation.
const GRADIENT_MAX_ITERATIONS: usize = 400;
const GRADIENT_TOLERANCE: f64 = 1e-6;

/// Barycentric tolerances of scipy's point location (`100 * DBL_EPSILON` and its square root).
const EPS: f64 = 100.0 * f64::EPSILON;
const EPS_BROAD: f64 = 1.490_116_119_384_765_6e-7; // sqrt(100 * DBL_EPSILON)

/// Why the samples cannot be triangulated.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum TriangulationError {
    /// A coordinate is not a finite number spade can place.
    #[error("sample {index} at ({x}, {y}) cannot be triangulated: {reason}")]
    BadPoint {
        /// Sample index.
        index: usize,
        /// First coordinate.
        x: f64,
        /// Second coordinate.
        y: f64,
        /// spade's explanation.
        reason: String,
    },
    /// All samples lie on one line (or there are fewer than three distinct ones).
    #[error("the samples span no area (all {0} distinct points are collinear)")]
    Degenerate(usize),
}

struct Site {
    position: Point2<f64>,
    index: usize,
}

impl HasPosition for Site {
    type Scalar = f64;

    fn position(&self) -> Point2<f64> {
        self.position
    }
}

/// A triangle: vertex indices and, for each vertex, the triangle across the opposite edge.
#[derive(Clone, Debug)]
struct Triangle {
    vertices: [usize; 3],
    neighbors: [Option<usize>; 3],
}

/// Relative area below which a triangle counts as degenerate: |e1 x e2| / (|e1| |e2|), the sine
/// of the angle between two edges.
const SLIVER_SINE: f64 = 1e-9;

fn is_sliver([a, b, c]: [[f64; 2]; 3]) -> bool {
    let e1 = [b[0] - a[0], b[1] - a[1]];
    let e2 = [c[0] - a[0], c[1] - a[1]];
    let cross = (e1[0] * e2[1] - e1[1] * e2[0]).abs();
    let norms = (e1[0].hypot(e1[1])) * (e2[0].hypot(e2[1]));
    norms == 0.0 || cross / norms < SLIVER_SINE
}

/// Number of edges of `t` that no other triangle of `all` shares.
fn boundary_edges(t: &Triangle, all: &[Triangle]) -> usize {
    (0..3)
        .filter(|&k| {
            let (a, b) = (t.vertices[(k + 1) % 3], t.vertices[(k + 2) % 3]);
            !all.iter()
                .any(|o| !std::ptr::eq(o, t) && o.vertices.contains(&a) && o.vertices.contains(&b))
        })
        .count()
}

/// Delaunay triangulation of scattered 2-D samples, shared by every value set on those samples.
#[derive(Clone, Debug)]
pub struct Triangulated {
    points: Vec<[f64; 2]>,
    triangles: Vec<Triangle>,
    /// Sorted neighbour vertices of each vertex (empty for duplicates left out).
    vertex_neighbors: Vec<Vec<usize>>,
}

impl Triangulated {
    /// Triangulates the samples. Later duplicates of a position are left out, as qhull leaves
    /// out coincident points.
    pub fn new(points: &[[f64; 2]]) -> Result<Self, TriangulationError> {
        let mut triangulation: DelaunayTriangulation<Site> = DelaunayTriangulation::new();
        let mut seen = std::collections::HashSet::new();
        for (index, &[x, y]) in points.iter().enumerate() {
            if !seen.insert((x.to_bits(), y.to_bits())) {
                continue;
            }
            triangulation
                .insert(Site {
                    position: Point2::new(x, y),
                    index,
                })
                .map_err(|e| TriangulationError::BadPoint {
                    index,
                    x,
                    y,
                    reason: format!("{e:?}"),
                })?;
        }
        let triangles: Vec<Triangle> = triangulation
            .inner_faces()
            .map(|face| {
                let [a, b, c] = face.vertices();
                Triangle {
                    vertices: [a.data().index, b.data().index, c.data().index],
                    neighbors: [None; 3],
                }
            })
            .collect();
        // Exact predicates keep slivers along hull edges whose points are collinear but for
        // rounding (profiles often sample x proportional to y); qhull, which scipy uses, treats
        // such points as collinear and has no triangle there. Drop them the same way.
        let all_points = points;
        let mut triangles = triangles;
        loop {
            let sliver = triangles.iter().position(|t| {
                is_sliver(t.vertices.map(|v| all_points[v])) && boundary_edges(t, &triangles) > 0
            });
            match sliver {
                Some(index) => {
                    triangles.remove(index);
                }
                None => break,
            }
        }
        if triangles.is_empty() {
            return Err(TriangulationError::Degenerate(seen.len()));
        }
        // Neighbour across the edge opposite each vertex, from a map of edges to triangles.
        let mut edges: std::collections::HashMap<(usize, usize), Vec<usize>> =
            std::collections::HashMap::new();
        for (t, triangle) in triangles.iter().enumerate() {
            for k in 0..3 {
                let (a, b) = (triangle.vertices[(k + 1) % 3], triangle.vertices[(k + 2) % 3]);
                edges.entry((a.min(b), a.max(b))).or_default().push(t);
            }
        }
        for (t, triangle) in triangles.iter_mut().enumerate() {
            let v = triangle.vertices;
            for (k, neighbor) in triangle.neighbors.iter_mut().enumerate() {
                let (a, b) = (v[(k + 1) % 3], v[(k + 2) % 3]);
                *neighbor = edges
                    .get(&(a.min(b), a.max(b)))
                    .and_then(|ts| ts.iter().copied().find(|&o| o != t));
            }
        }
        let mut vertex_neighbors = vec![Vec::new(); points.len()];
        for &(a, b) in edges.keys() {
            vertex_neighbors[a].push(b);
            vertex_neighbors[b].push(a);
        }
        for list in &mut vertex_neighbors {
            list.sort_unstable();
        }
        Ok(Self {
            points: points.to_vec(),
            triangles,
            vertex_neighbors,
        })
    }

    /// Prepares the interpolant of one value set (one value per sample).
    pub fn interpolant(&self, values: &[f64]) -> CloughTocher<'_> {
        CloughTocher {
            mesh: self,
            values: values.to_vec(),
            gradients: self.estimate_gradients(values),
        }
    }

    /// scipy's `estimate_gradients_2d_global`: per vertex, minimise the summed squared second
    /// derivative of the interpolant along its edges, by Gauss-Seidel sweeps.
    fn estimate_gradients(&self, values: &[f64]) -> Vec<[f64; 2]> {
        let mut gradients = vec![[0.0_f64; 2]; self.points.len()];
        for _ in 0..GRADIENT_MAX_ITERATIONS {
            let mut error: f64 = 0.0;
            for (point, neighbors) in self.vertex_neighbors.iter().enumerate() {
                if neighbors.is_empty() {
                    continue;
                }
                let mut q = [0.0_f64; 3]; // [xx, xy, yy] of the symmetric 2x2 system
                let mut s = [0.0_f64; 2];
                for &other in neighbors {
                    let ex = self.points[other][0] - self.points[point][0];
                    let ey = self.points[other][1] - self.points[point][1];
                    let length = (ex * ex + ey * ey).sqrt();
                    let length3 = length * length * length;
                    let f1 = values[point];
                    let f2 = values[other];
                    let df2 = -ex * gradients[other][0] - ey * gradients[other][1];
                    q[0] += 4.0 * ex * ex / length3;
                    q[1] += 4.0 * ex * ey / length3;
                    q[2] += 4.0 * ey * ey / length3;
                    s[0] += (6.0 * (f1 - f2) - 2.0 * df2) * ex / length3;
                    s[1] += (6.0 * (f1 - f2) - 2.0 * df2) * ey / length3;
                }
                let det = q[0] * q[2] - q[1] * q[1];
                let r0 = (q[2] * s[0] - q[1] * s[1]) / det;
                let r1 = (-q[1] * s[0] + q[0] * s[1]) / det;
                let change = (gradients[point][0] + r0)
                    .abs()
                    .max((gradients[point][1] + r1).abs());
                gradients[point] = [-r0, -r1];
                error = error.max(change / 1.0_f64.max(r0.abs().max(r1.abs())));
            }
            if error < GRADIENT_TOLERANCE {
                break;
            }
        }
        gradients
    }

    /// Barycentric coordinates of `p` in triangle `t`.
    fn barycentric(&self, t: usize, p: [f64; 2]) -> [f64; 3] {
        let [a, b, c] = self.triangles[t].vertices.map(|v| self.points[v]);
        let det = (b[1] - c[1]) * (a[0] - c[0]) + (c[0] - b[0]) * (a[1] - c[1]);
        let l0 = ((b[1] - c[1]) * (p[0] - c[0]) + (c[0] - b[0]) * (p[1] - c[1])) / det;
        let l1 = ((c[1] - a[1]) * (p[0] - c[0]) + (a[0] - c[0]) * (p[1] - c[1])) / det;
        [l0, l1, 1.0 - l0 - l1]
    }

    /// The triangle containing `p` and `p`'s barycentric coordinates in it. Points within
    /// rounding error of the hull count as inside, as in scipy.
    fn locate(&self, p: [f64; 2]) -> Option<(usize, [f64; 3])> {
        let inside = |c: &[f64; 3], eps: f64| c.iter().all(|&v| v >= -eps && v <= 1.0 + eps);
        (0..self.triangles.len())
            .map(|t| (t, self.barycentric(t, p)))
            .find(|(_, c)| inside(c, EPS))
            .or_else(|| {
                (0..self.triangles.len())
                    .filter(|&t| self.triangles[t].neighbors.iter().any(Option::is_none))
                    .map(|t| (t, self.barycentric(t, p)))
                    .find(|(_, c)| inside(c, EPS_BROAD))
            })
    }
}

/// The Clough-Tocher interpolant of one value set.
#[derive(Clone, Debug)]
pub struct CloughTocher<'a> {
    mesh: &'a Triangulated,
    values: Vec<f64>,
    gradients: Vec<[f64; 2]>,
}

impl CloughTocher<'_> {
    /// The interpolated value at `p`, or `None` outside the convex hull of the samples.
    pub fn evaluate(&self, p: [f64; 2]) -> Option<f64> {
        let (t, b) = self.mesh.locate(p)?;
        Some(self.evaluate_in(t, b))
    }

    /// Evaluates the cubic Bezier patches of the Clough-Tocher split of triangle `t`.
    fn evaluate_in(&self, t: usize, b: [f64; 3]) -> f64 {
        let mesh = self.mesh;
        let triangle = &mesh.triangles[t];
        let [p1, p2, p3] = triangle.vertices.map(|v| mesh.points[v]);
        let [f1, f2, f3] = triangle.vertices.map(|v| self.values[v]);
        let [g1, g2, g3] = triangle.vertices.map(|v| self.gradients[v]);
        let e12 = [p2[0] - p1[0], p2[1] - p1[1]];
        let e23 = [p3[0] - p2[0], p3[1] - p2[1]];
        let e31 = [p1[0] - p3[0], p1[1] - p3[1]];
        let dot = |g: [f64; 2], e: [f64; 2]| g[0] * e[0] + g[1] * e[1];

        // Derivatives along the edges, away from each vertex.
        let df12 = dot(g1, e12);
        let df21 = -dot(g2, e12);
        let df23 = dot(g2, e23);
        let df32 = -dot(g3, e23);
        let df31 = dot(g3, e31);
        let df13 = -dot(g1, e31);

        let c3000 = f1;
        let c2100 = (df12 + 3.0 * c3000) / 3.0;
        let c2010 = (df13 + 3.0 * c3000) / 3.0;
        let c0300 = f2;
        let c1200 = (df21 + 3.0 * c0300) / 3.0;
        let c0210 = (df23 + 3.0 * c0300) / 3.0;
        let c0030 = f3;
        let c1020 = (df31 + 3.0 * c0030) / 3.0;
        let c0120 = (df32 + 3.0 * c0030) / 3.0;

        let c2001 = (c2100 + c2010 + c3000) / 3.0;
        let c0201 = (c1200 + c0300 + c0210) / 3.0;
        let c0021 = (c1020 + c0120 + c0030) / 3.0;

        // Cross-boundary derivative directions: towards the neighbour's centroid, which is
        // affine invariant and shared by both triangles of an edge (so the result is C1).
        let mut g = [-0.5_f64; 3];
        for (k, neighbor) in triangle.neighbors.iter().enumerate() {
            let Some(other) = *neighbor else { continue };
            let centroid = mesh.triangles[other].vertices.iter().fold([0.0, 0.0], |acc, &v| {
                [acc[0] + mesh.points[v][0] / 3.0, acc[1] + mesh.points[v][1] / 3.0]
            });
            let c = mesh.barycentric(t, centroid);
            g[k] = match k {
                0 => (2.0 * c[2] + c[1] - 1.0) / (2.0 - 3.0 * c[2] - 3.0 * c[1]),
                1 => (2.0 * c[0] + c[2] - 1.0) / (2.0 - 3.0 * c[0] - 3.0 * c[2]),
                _ => (2.0 * c[1] + c[0] - 1.0) / (2.0 - 3.0 * c[1] - 3.0 * c[0]),
            };
        }

        let c0111 = (g[0] * (-c0300 + 3.0 * c0210 - 3.0 * c0120 + c0030)
            + (-c0300 + 2.0 * c0210 - c0120 + c0021 + c0201))
            / 2.0;
        let c1011 = (g[1] * (-c0030 + 3.0 * c1020 - 3.0 * c2010 + c3000)
            + (-c0030 + 2.0 * c1020 - c2010 + c2001 + c0021))
            / 2.0;
        let c1101 = (g[2] * (-c3000 + 3.0 * c2100 - 3.0 * c1200 + c0300)
            + (-c3000 + 2.0 * c2100 - c1200 + c2001 + c0201))
            / 2.0;

        let c1002 = (c1101 + c1011 + c2001) / 3.0;
        let c0102 = (c1101 + c0111 + c0201) / 3.0;
        let c0012 = (c1011 + c0111 + c0021) / 3.0;
        let c0003 = (c1002 + c0102 + c0012) / 3.0;

        // Extended barycentric coordinates of the sub-triangle the point falls in.
        let min = b[0].min(b[1]).min(b[2]);
        let (b1, b2, b3, b4) = (b[0] - min, b[1] - min, b[2] - min, 3.0 * min);

        b1.powi(3) * c3000
            + 3.0 * b1 * b1 * b2 * c2100
            + 3.0 * b1 * b1 * b3 * c2010
            + 3.0 * b1 * b1 * b4 * c2001
            + 3.0 * b1 * b2 * b2 * c1200
            + 6.0 * b1 * b2 * b4 * c1101
            + 3.0 * b1 * b3 * b3 * c1020
            + 6.0 * b1 * b3 * b4 * c1011
            + 3.0 * b1 * b4 * b4 * c1002
            + b2.powi(3) * c0300
            + 3.0 * b2 * b2 * b3 * c0210
            + 3.0 * b2 * b2 * b4 * c0201
            + 3.0 * b2 * b3 * b3 * c0120
            + 6.0 * b2 * b3 * b4 * c0111
            + 3.0 * b2 * b4 * b4 * c0102
            + b3.powi(3) * c0030
            + 3.0 * b3 * b3 * b4 * c0021
            + 3.0 * b3 * b4 * b4 * c0012
            + b4.powi(3) * c0003
    }
}

/// Value of the sample nearest to `p` (Euclidean, first sample on ties), as scipy's
/// `NearestNDInterpolator` fills points outside the hull.
pub fn nearest_value(points: &[[f64; 2]], values: &[f64], p: [f64; 2]) -> f64 {
    let distance = |q: &[f64; 2]| (q[0] - p[0]).powi(2) + (q[1] - p[1]).powi(2);
    points
        .iter()
        .zip(values)
        .fold((f64::INFINITY, f64::NAN), |best, (q, &v)| {
            let d = distance(q);
            if d < best.0 { (d, v) } else { best }
        })
        .1
}

#[cfg(test)]
mod tests {
    use super::*;

    fn square_with_center() -> Vec<[f64; 2]> {
        vec![[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.4, 0.6]]
    }

    #[test]
    fn reproduces_samples_and_linear_functions() {
        let points = square_with_center();
        let mesh = Triangulated::new(&points).unwrap();
        let linear: Vec<f64> = points.iter().map(|p| 2.0 * p[0] - 3.0 * p[1] + 1.0).collect();
        let interpolant = mesh.interpolant(&linear);
        for (p, v) in points.iter().zip(&linear) {
            assert!((interpolant.evaluate(*p).unwrap() - v).abs() < 1e-9);
        }
        // The curvature-minimising gradients of linear data are exact, so the interpolant is the plane.
        for q in [[0.5, 0.5], [0.1, 0.8], [0.9, 0.2], [0.3, 0.3]] {
            let expected = 2.0 * q[0] - 3.0 * q[1] + 1.0;
            assert!(
                (interpolant.evaluate(q).unwrap() - expected).abs() < 1e-6,
                "{q:?}"
            );
        }
    }

    #[test]
    fn outside_the_hull_is_none_and_nearest_fills_it() {
        let points = square_with_center();
        let mesh = Triangulated::new(&points).unwrap();
        let values = [1.0, 2.0, 3.0, 4.0, 5.0];
        let interpolant = mesh.interpolant(&values);
        assert_eq!(interpolant.evaluate([1.5, 0.5]), None);
        assert_eq!(interpolant.evaluate([-0.1, 0.0]), None);
        assert_eq!(nearest_value(&points, &values, [1.5, 1.2]), 4.0);
        // Hull edges belong to the hull.
        assert!(interpolant.evaluate([1.0, 0.5]).is_some());
    }

    #[test]
    fn smooth_function_is_approximated() {
        let mut points = Vec::new();
        for i in 0..9 {
            for j in 0..9 {
                // A slightly irregular grid, so the Delaunay triangulation is unique.
                points.push([
                    i as f64 / 8.0 + 0.003 * (j as f64).sin(),
                    j as f64 / 8.0 + 0.002 * (i as f64).cos(),
                ]);
            }
        }
        let f = |p: [f64; 2]| (p[0] * 2.0).sin() * (p[1] * 3.0).cos();
        let values: Vec<f64> = points.iter().map(|&p| f(p)).collect();
        let mesh = Triangulated::new(&points).unwrap();
        let interpolant = mesh.interpolant(&values);
        for q in [[0.31, 0.47], [0.52, 0.11], [0.77, 0.66]] {
            assert!((interpolant.evaluate(q).unwrap() - f(q)).abs() < 5e-3, "{q:?}");
        }
    }

    #[test]
    fn collinear_samples_are_refused() {
        let error = Triangulated::new(&[[0.0, 0.0], [1.0, 1.0], [2.0, 2.0]]).unwrap_err();
        assert_eq!(error, TriangulationError::Degenerate(3));
    }

    #[test]
    fn duplicates_keep_the_first_sample() {
        let points = [[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [1.0, 0.0]];
        let mesh = Triangulated::new(&points).unwrap();
        let interpolant = mesh.interpolant(&[1.0, 2.0, 3.0, 99.0]);
        assert!((interpolant.evaluate([1.0, 0.0]).unwrap() - 2.0).abs() < 1e-12);
    }
}
