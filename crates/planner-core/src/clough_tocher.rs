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

/// Delaunay triangulation of scattered 2-D samples, shared by every value set on those samples.
#[derive(Clone, Debug)]
pub struct Triangulated {
    points: Vec<[f64; 2]>,
    triangles: Vec<Triangle>,
    /// Sorted neighbour vertices of each vertex (empty for duplicates left out).
    vertex_neighbors: Vec<Vec<usize>>,
    /// Buckets of triangles, for point location.
    grid: TriangleGrid,
    /// Every sample (duplicates included), for nearest-sample queries.
    nearest: NearestIndex,
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
        let mut triangles = remove_hull_slivers(points, triangles);
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
        let grid = TriangleGrid::new(points, &triangles);
        Ok(Self {
            points: points.to_vec(),
            triangles,
            vertex_neighbors,
            grid,
            nearest: NearestIndex::new(points),
        })
    }

    /// Index of the sample nearest to `p` (Euclidean, first sample on ties), as scipy's
    /// `NearestNDInterpolator` fills points outside the hull.
    pub fn nearest_sample(&self, p: [f64; 2]) -> Option<usize> {
        self.nearest.nearest(&self.points, p)
    }

    /// Value of the sample nearest to `p` (see [`Triangulated::nearest_sample`]); NaN when
    /// `values` has no value for it.
    pub fn nearest_value(&self, values: &[f64], p: [f64; 2]) -> f64 {
        self.nearest_sample(p)
            .and_then(|i| values.get(i).copied())
            .unwrap_or(f64::NAN)
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
    ///
    /// The first triangle (in triangulation order) that contains `p`, else the first hull
    /// triangle that contains it within the broader tolerance: the same answer as a scan of
    /// every triangle, found among the few whose bucket holds `p`.
    fn locate(&self, p: [f64; 2]) -> Option<(usize, [f64; 3])> {
        let inside = |c: &[f64; 3], eps: f64| c.iter().all(|&v| v >= -eps && v <= 1.0 + eps);
        let candidates = self.grid.candidates(p);
        candidates
            .iter()
            .map(|&t| (t as usize, self.barycentric(t as usize, p)))
            .find(|(_, c)| inside(c, EPS))
            .or_else(|| {
                candidates
                    .iter()
                    .map(|&t| t as usize)
                    .filter(|&t| self.triangles[t].neighbors.iter().any(Option::is_none))
                    .map(|t| (t, self.barycentric(t, p)))
                    .find(|(_, c)| inside(c, EPS_BROAD))
            })
    }
}

/// Drops slivers that have an edge on the boundary, repeatedly (dropping one puts its other
/// edges on the boundary). The result is the same whatever the order: a sliver with a boundary
/// edge keeps it, so every sliver reachable from the boundary through slivers goes. Linear in
/// the number of triangles: each is queued at most once per edge.
fn remove_hull_slivers(points: &[[f64; 2]], triangles: Vec<Triangle>) -> Vec<Triangle> {
    let edge = |t: &Triangle, k: usize| {
        let (a, b) = (t.vertices[(k + 1) % 3], t.vertices[(k + 2) % 3]);
        (a.min(b), a.max(b))
    };
    let mut sharing: std::collections::HashMap<(usize, usize), Vec<usize>> =
        std::collections::HashMap::with_capacity(triangles.len() * 2);
    for (index, triangle) in triangles.iter().enumerate() {
        for k in 0..3 {
            sharing.entry(edge(triangle, k)).or_default().push(index);
        }
    }
    let sliver: Vec<bool> = triangles
        .iter()
        .map(|t| is_sliver(t.vertices.map(|v| points[v])))
        .collect();
    let mut removed = vec![false; triangles.len()];
    let on_boundary = |index: usize, removed: &[bool], k: usize| {
        sharing
            .get(&edge(&triangles[index], k))
            .is_none_or(|ts| ts.iter().all(|&o| o == index || removed[o]))
    };
    let mut queue: Vec<usize> = (0..triangles.len())
        .filter(|&t| sliver[t] && (0..3).any(|k| on_boundary(t, &removed, k)))
        .collect();
    while let Some(index) = queue.pop() {
        if removed[index] {
            continue;
        }
        removed[index] = true;
        for k in 0..3 {
            for &other in sharing.get(&edge(&triangles[index], k)).into_iter().flatten() {
                if other != index && sliver[other] && !removed[other] {
                    queue.push(other);
                }
            }
        }
    }
    triangles
        .into_iter()
        .zip(removed)
        .filter_map(|(t, removed)| (!removed).then_some(t))
        .collect()
}

/// Buckets of triangles over a uniform grid: each triangle is listed (in triangulation order)
/// in every bucket it overlaps once widened by the location tolerance, so the triangles that can
/// contain a point are those of the point's bucket. A triangle is clipped to each row of
/// buckets, so a long thin one is listed along its length only, not over its bounding box.
#[derive(Clone, Debug)]
struct TriangleGrid {
    origin: [f64; 2],
    cell: [f64; 2],
    side: usize,
    /// `items[starts[b]..starts[b + 1]]` are the triangles of bucket `b`, ascending.
    starts: Vec<usize>,
    items: Vec<u32>,
}

/// A triangle's corners and how far, per axis, a point it contains within the broad
/// barycentric tolerance (or rounding error) can lie outside it.
struct Footprint {
    corners: [[f64; 2]; 3],
    margin: [f64; 2],
}

impl Footprint {
    fn new(corners: [[f64; 2]; 3]) -> Self {
        // With barycentric coordinates in [-e, 1 + e], a point is within 3e times the
        // triangle's extent of it on each axis; 8e leaves room for rounding.
        let margin = [0, 1].map(|axis| {
            let (lo, hi) = corners
                .iter()
                .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), c| {
                    (lo.min(c[axis]), hi.max(c[axis]))
                });
            8.0 * EPS_BROAD * (hi - lo) + 16.0 * f64::EPSILON * lo.abs().max(hi.abs())
        });
        Self { corners, margin }
    }

    /// The widened extent on `axis`: `[lo, hi]`.
    fn extent(&self, axis: usize) -> [f64; 2] {
        let lo = self.corners.iter().map(|c| c[axis]).fold(f64::INFINITY, f64::min);
        let hi = self
            .corners
            .iter()
            .map(|c| c[axis])
            .fold(f64::NEG_INFINITY, f64::max);
        [lo - self.margin[axis], hi + self.margin[axis]]
    }

    /// The widened x extent of the part of the triangle within the widened strip
    /// `y0 <= y <= y1`, if any.
    fn x_extent_in(&self, y0: f64, y1: f64) -> Option<[f64; 2]> {
        let (y0, y1) = (y0 - self.margin[1], y1 + self.margin[1]);
        let mut lo = f64::INFINITY;
        let mut hi = f64::NEG_INFINITY;
        let mut take = |x: f64| {
            lo = lo.min(x);
            hi = hi.max(x);
        };
        for (k, a) in self.corners.iter().enumerate() {
            if a[1] >= y0 && a[1] <= y1 {
                take(a[0]);
            }
            let b = self.corners[(k + 1) % 3];
            for y in [y0, y1] {
                if a[1] != b[1] && a[1].min(b[1]) <= y && y <= a[1].max(b[1]) {
                    take(a[0] + (y - a[1]) * (b[0] - a[0]) / (b[1] - a[1]));
                }
            }
        }
        (lo <= hi).then(|| [lo - self.margin[0], hi + self.margin[0]])
    }
}

/// Bucket entries allowed per triangle before the grid is made coarser.
const GRID_ENTRIES_PER_TRIANGLE: usize = 64;

impl TriangleGrid {
    fn new(points: &[[f64; 2]], triangles: &[Triangle]) -> Self {
        let footprints: Vec<Footprint> = triangles
            .iter()
            .map(|t| Footprint::new(t.vertices.map(|v| points[v])))
            .collect();
        let bounds = footprints.iter().fold(
            [f64::INFINITY, f64::INFINITY, f64::NEG_INFINITY, f64::NEG_INFINITY],
            |acc, f| {
                let ([x0, x1], [y0, y1]) = (f.extent(0), f.extent(1));
                [acc[0].min(x0), acc[1].min(y0), acc[2].max(x1), acc[3].max(y1)]
            },
        );
        let mut side = (triangles.len() as f64).sqrt().ceil().max(1.0) as usize;
        loop {
            let grid = Self::empty(bounds, side);
            let mut entries = 0;
            for footprint in &footprints {
                grid.for_each_bucket(footprint, |_| entries += 1);
            }
            if side == 1 || entries <= GRID_ENTRIES_PER_TRIANGLE * triangles.len() + side * side {
                return grid.filled(&footprints, entries);
            }
            side /= 2;
        }
    }

    fn empty(bounds: [f64; 4], side: usize) -> Self {
        let width = |lo: f64, hi: f64| if hi > lo { (hi - lo) / side as f64 } else { 1.0 };
        Self {
            origin: [bounds[0], bounds[1]],
            cell: [width(bounds[0], bounds[2]), width(bounds[1], bounds[3])],
            side,
            starts: Vec::new(),
            items: Vec::new(),
        }
    }

    /// Column or row of a coordinate, clamped to the grid.
    fn slot(&self, value: f64, axis: usize) -> usize {
        let position = ((value - self.origin[axis]) / self.cell[axis]).floor();
        if position.is_nan() || position < 0.0 {
            0
        } else {
            (position as usize).min(self.side - 1)
        }
    }

    /// Calls `visit` with each bucket the widened triangle overlaps.
    fn for_each_bucket(&self, footprint: &Footprint, mut visit: impl FnMut(usize)) {
        let [y0, y1] = footprint.extent(1);
        for row in self.slot(y0, 1)..=self.slot(y1, 1) {
            let bottom = self.origin[1] + row as f64 * self.cell[1];
            // The first and last rows reach to the grid's edges (points on them are clamped in).
            let strip_lo = if row == 0 { f64::NEG_INFINITY } else { bottom };
            let strip_hi = if row + 1 == self.side {
                f64::INFINITY
            } else {
                bottom + self.cell[1]
            };
            if let Some([x0, x1]) = footprint.x_extent_in(strip_lo.max(y0), strip_hi.min(y1)) {
                for column in self.slot(x0, 0)..=self.slot(x1, 0) {
                    visit(row * self.side + column);
                }
            }
        }
    }

    fn filled(mut self, footprints: &[Footprint], entries: usize) -> Self {
        let buckets = self.side * self.side;
        let mut counts = vec![0_usize; buckets + 1];
        for footprint in footprints {
            self.for_each_bucket(footprint, |bucket| counts[bucket + 1] += 1);
        }
        for i in 1..counts.len() {
            counts[i] += counts[i - 1];
        }
        let mut next = counts.clone();
        let mut items = vec![0_u32; entries];
        for (t, footprint) in footprints.iter().enumerate() {
            self.for_each_bucket(footprint, |bucket| {
                items[next[bucket]] = t as u32;
                next[bucket] += 1;
            });
        }
        self.starts = counts;
        self.items = items;
        self
    }

    /// The triangles that may contain `p`, in triangulation order.
    fn candidates(&self, p: [f64; 2]) -> &[u32] {
        let outside = |axis: usize| {
            let lo = self.origin[axis];
            let hi = lo + self.cell[axis] * self.side as f64;
            !(p[axis] >= lo && p[axis] <= hi)
        };
        if self.items.is_empty() || outside(0) || outside(1) {
            return &[];
        }
        let bucket = self.slot(p[1], 1) * self.side + self.slot(p[0], 0);
        &self.items[self.starts[bucket]..self.starts[bucket + 1]]
    }
}

/// A 2-d tree over the samples for nearest-sample queries (exact, first sample on ties).
#[derive(Clone, Debug)]
struct NearestIndex {
    /// Sample indices arranged as an implicit tree: the median of each range splits it, on x
    /// at even depths and y at odd ones.
    order: Vec<usize>,
}

impl NearestIndex {
    fn new(points: &[[f64; 2]]) -> Self {
        let mut order: Vec<usize> = (0..points.len()).collect();
        Self::build(points, &mut order, 0);
        Self { order }
    }

    fn build(points: &[[f64; 2]], range: &mut [usize], depth: usize) {
        if range.len() <= 1 {
            return;
        }
        let axis = depth % 2;
        let middle = range.len() / 2;
        range.select_nth_unstable_by(middle, |&a, &b| {
            points[a][axis].total_cmp(&points[b][axis]).then(a.cmp(&b))
        });
        let (left, right) = range.split_at_mut(middle);
        Self::build(points, left, depth + 1);
        Self::build(points, &mut right[1..], depth + 1);
    }

    fn nearest(&self, points: &[[f64; 2]], p: [f64; 2]) -> Option<usize> {
        let mut best: Option<(f64, usize)> = None;
        self.search(points, p, 0, self.order.len(), 0, &mut best);
        best.map(|(_, index)| index)
    }

    fn search(
        &self,
        points: &[[f64; 2]],
        p: [f64; 2],
        lo: usize,
        hi: usize,
        depth: usize,
        best: &mut Option<(f64, usize)>,
    ) {
        if lo >= hi {
            return;
        }
        let middle = lo + (hi - lo) / 2;
        let index = self.order[middle];
        let q = points[index];
        let distance = (q[0] - p[0]).powi(2) + (q[1] - p[1]).powi(2);
        let better = match *best {
            None => true,
            Some((d, i)) => distance < d || (distance == d && index < i),
        };
        if better {
            *best = Some((distance, index));
        }
        let axis = depth % 2;
        let offset = p[axis] - q[axis];
        let (near, far) = if offset < 0.0 {
            ((lo, middle), (middle + 1, hi))
        } else {
            ((middle + 1, hi), (lo, middle))
        };
        self.search(points, p, near.0, near.1, depth + 1, best);
        // Visit the other side unless it is strictly farther: ties go to the first sample.
        if best.is_none_or(|(d, _)| offset * offset <= d) {
            self.search(points, p, far.0, far.1, depth + 1, best);
        }
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

    /// The point location of a scan of every triangle, as the bucketed one must answer.
    fn locate_by_scan(mesh: &Triangulated, p: [f64; 2]) -> Option<(usize, [f64; 3])> {
        let inside = |c: &[f64; 3], eps: f64| c.iter().all(|&v| v >= -eps && v <= 1.0 + eps);
        (0..mesh.triangles.len())
            .map(|t| (t, mesh.barycentric(t, p)))
            .find(|(_, c)| inside(c, EPS))
            .or_else(|| {
                (0..mesh.triangles.len())
                    .filter(|&t| mesh.triangles[t].neighbors.iter().any(Option::is_none))
                    .map(|t| (t, mesh.barycentric(t, p)))
                    .find(|(_, c)| inside(c, EPS_BROAD))
            })
    }

    /// Queries that hit vertices, edges (where several triangles contain the point and the
    /// first must win), the hull within rounding, and the outside.
    fn queries(points: &[[f64; 2]]) -> Vec<[f64; 2]> {
        let (mut lo, mut hi) = ([f64::INFINITY; 2], [f64::NEG_INFINITY; 2]);
        for p in points {
            for axis in 0..2 {
                lo[axis] = lo[axis].min(p[axis]);
                hi[axis] = hi[axis].max(p[axis]);
            }
        }
        let mut queries: Vec<[f64; 2]> = points.to_vec();
        for pair in points.windows(2) {
            queries.push([(pair[0][0] + pair[1][0]) / 2.0, (pair[0][1] + pair[1][1]) / 2.0]);
        }
        for i in 0..=20 {
            for j in 0..=20 {
                let t = [f64::from(i) / 20.0, f64::from(j) / 20.0];
                queries.push([
                    lo[0] - 0.1 * (hi[0] - lo[0]) + 1.2 * t[0] * (hi[0] - lo[0]),
                    lo[1] - 0.1 * (hi[1] - lo[1]) + 1.2 * t[1] * (hi[1] - lo[1]),
                ]);
            }
        }
        queries
    }

    fn nearest_by_scan(points: &[[f64; 2]], p: [f64; 2]) -> usize {
        let distance = |q: &[f64; 2]| (q[0] - p[0]).powi(2) + (q[1] - p[1]).powi(2);
        (0..points.len())
            .fold((f64::INFINITY, 0), |best, i| {
                let d = distance(&points[i]);
                if d < best.0 { (d, i) } else { best }
            })
            .1
    }

    fn check_against_scans(points: &[[f64; 2]]) {
        let Ok(mesh) = Triangulated::new(points) else {
            return;
        };
        for q in queries(points) {
            assert_eq!(mesh.locate(q), locate_by_scan(&mesh, q), "{q:?} in {points:?}");
            assert_eq!(mesh.nearest_sample(q), Some(nearest_by_scan(points, q)), "{q:?}");
        }
    }

    #[test]
    fn location_and_nearest_equal_full_scans_on_regular_grids() {
        // Regular grids: every edge midpoint and vertex lies in several triangles, and many
        // queries are equally near several samples.
        let grid: Vec<[f64; 2]> = (0..8)
            .flat_map(|i| (0..6).map(move |j| [f64::from(i) * 0.125, 100.0 + 250.0 * f64::from(j)]))
            .collect();
        check_against_scans(&grid);
        // The published profile layout: rays of constant concurrency.
        let rays: Vec<[f64; 2]> = (1..9)
            .flat_map(|n| {
                (1..7).map(move |row| [f64::from(n) * f64::from(row) * 0.017, 300.0 * f64::from(row)])
            })
            .collect();
        check_against_scans(&rays);
        // Duplicates: the first of a position is the one found.
        check_against_scans(&[
            [0.0, 0.0],
            [1.0, 0.0],
            [0.0, 1.0],
            [1.0, 0.0],
            [0.5, 0.5],
            [0.0, 0.0],
        ]);
    }

    #[test]
    fn hull_slivers_are_peeled_in_any_order() {
        // Points along a hull edge, off it by far less than rounding matters, with an apex.
        let mut points: Vec<[f64; 2]> = (0..30)
            .map(|i| [f64::from(i) / 29.0, 1e-13 * f64::from(i % 2)])
            .collect();
        points.push([0.5, 1.0]);
        let mesh = Triangulated::new(&points).unwrap();
        assert!(
            mesh.triangles
                .iter()
                .all(|t| !is_sliver(t.vertices.map(|v| mesh.points[v]))),
            "a hull sliver is left"
        );
        // The fan from the apex covers the base.
        let values: Vec<f64> = points.iter().map(|p| p[0] + p[1]).collect();
        assert!(mesh.interpolant(&values).evaluate([0.3, 0.1]).is_some());
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

        #[test]
        fn location_and_nearest_equal_full_scans(
            raw in proptest::collection::vec((0_u16..40, 0_u16..40), 3..60),
        ) {
            // Coarse integer coordinates: ties, collinear runs and duplicates are common.
            let points: Vec<[f64; 2]> = raw
                .iter()
                .map(|&(x, y)| [f64::from(x) / 40.0, 100.0 + 50.0 * f64::from(y)])
                .collect();
            check_against_scans(&points);
        }
    }
}
