//! The few dense linear-algebra pieces ARIMA estimation needs, on matrices of at most 36x36:
//! a linear solve, a minimum-norm least-squares fit and polynomial inverse roots. Written out
//! rather than pulled from a linear-algebra crate because they are this small and must never
//! panic on degenerate input (they report failure instead).

/// Solves `a x = b` in place (`a` is `n x n`, row-major) by Gaussian elimination with partial
/// pivoting; `b` becomes `x`. `None` if `a` is singular to working precision.
pub(super) fn solve(a: &mut [f64], b: &mut [f64], n: usize) -> Option<()> {
    let scale = a.iter().fold(0.0_f64, |m, v| m.max(v.abs()));
    if scale.is_nan() || scale <= 0.0 || !scale.is_finite() {
        return None;
    }
    for col in 0..n {
        let pivot_row = (col..n).max_by(|&i, &j| a[i * n + col].abs().total_cmp(&a[j * n + col].abs()))?;
        let pivot = a[pivot_row * n + col];
        if pivot.abs() <= scale * 1e-14 {
            return None;
        }
        if pivot_row != col {
            for k in 0..n {
                a.swap(col * n + k, pivot_row * n + k);
            }
            b.swap(col, pivot_row);
        }
        for row in col + 1..n {
            let factor = a[row * n + col] / pivot;
            if factor == 0.0 {
                continue;
            }
            for k in col..n {
                a[row * n + k] -= factor * a[col * n + k];
            }
            b[row] -= factor * b[col];
        }
    }
    for row in (0..n).rev() {
        let mut acc = b[row];
        for k in row + 1..n {
            acc -= a[row * n + k] * b[k];
        }
        b[row] = acc / a[row * n + row];
    }
    b.iter().all(|v| v.is_finite()).then_some(())
}

/// Minimum-norm least squares `argmin |X c - y|` (what `numpy.linalg.pinv(X) @ y` gives),
/// through the eigen-decomposition of `X'X` (cyclic Jacobi). Tiny eigenvalues are dropped as
/// `pinv` drops tiny singular values. Returns zeros when there are no rows.
pub(super) fn least_squares(rows: &[Vec<f64>], y: &[f64], cols: usize) -> Vec<f64> {
    if cols == 0 || rows.is_empty() {
        return vec![0.0; cols];
    }
    let mut gram = vec![0.0; cols * cols];
    let mut xty = vec![0.0; cols];
    for (row, target) in rows.iter().zip(y) {
        for i in 0..cols {
            xty[i] += row[i] * target;
            for j in i..cols {
                gram[i * cols + j] += row[i] * row[j];
            }
        }
    }
    for i in 0..cols {
        for j in 0..i {
            gram[i * cols + j] = gram[j * cols + i];
        }
    }
    let (values, vectors) = symmetric_eigen(gram, cols);
    let largest = values.iter().fold(0.0_f64, |m, v| m.max(v.abs()));
    // pinv's rcond 1e-15 applies to singular values; eigenvalues of X'X are their squares, and
    // the Gram matrix itself carries ~1e-16 relative error, so a looser cut is the honest one.
    let cutoff = largest * 1e-12;
    let mut coef = vec![0.0; cols];
    for (k, lambda) in values.iter().enumerate() {
        if *lambda <= cutoff {
            continue;
        }
        let proj: f64 = (0..cols).map(|i| vectors[i * cols + k] * xty[i]).sum::<f64>() / lambda;
        for i in 0..cols {
            coef[i] += vectors[i * cols + k] * proj;
        }
    }
    if coef.iter().all(|c| c.is_finite()) {
        coef
    } else {
        vec![0.0; cols]
    }
}

/// Eigenvalues and eigenvectors (columns, row-major `n x n`) of a symmetric matrix.
fn symmetric_eigen(mut a: Vec<f64>, n: usize) -> (Vec<f64>, Vec<f64>) {
    let mut v = vec![0.0; n * n];
    for i in 0..n {
        v[i * n + i] = 1.0;
    }
    for _sweep in 0..100 {
        let off: f64 = (0..n)
            .flat_map(|i| (0..n).filter(move |&j| j != i).map(move |j| (i, j)))
            .map(|(i, j)| a[i * n + j] * a[i * n + j])
            .sum();
        let diag: f64 = (0..n).map(|i| a[i * n + i] * a[i * n + i]).sum();
        if off <= 1e-30 * diag.max(f64::MIN_POSITIVE) {
            break;
        }
        for p in 0..n {
            for q in p + 1..n {
                let apq = a[p * n + q];
                if apq == 0.0 {
                    continue;
                }
                let theta = (a[q * n + q] - a[p * n + p]) / (2.0 * apq);
                let t = theta.signum() / (theta.abs() + (theta * theta + 1.0).sqrt());
                let t = if theta == 0.0 { 1.0 } else { t };
                let c = 1.0 / (t * t + 1.0).sqrt();
                let s = t * c;
                for k in 0..n {
                    let akp = a[k * n + p];
                    let akq = a[k * n + q];
                    a[k * n + p] = c * akp - s * akq;
                    a[k * n + q] = s * akp + c * akq;
                }
                for k in 0..n {
                    let apk = a[p * n + k];
                    let aqk = a[q * n + k];
                    a[p * n + k] = c * apk - s * aqk;
                    a[q * n + k] = s * apk + c * aqk;
                }
                for k in 0..n {
                    let vkp = v[k * n + p];
                    let vkq = v[k * n + q];
                    v[k * n + p] = c * vkp - s * vkq;
                    v[k * n + q] = s * vkp + c * vkq;
                }
            }
        }
    }
    ((0..n).map(|i| a[i * n + i]).collect(), v)
}

/// A complex number, just enough for polynomial roots.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Complex {
    re: f64,
    im: f64,
}

impl Complex {
    const fn new(re: f64, im: f64) -> Self {
        Self { re, im }
    }
    fn add(self, o: Self) -> Self {
        Self::new(self.re + o.re, self.im + o.im)
    }
    fn sub(self, o: Self) -> Self {
        Self::new(self.re - o.re, self.im - o.im)
    }
    fn mul(self, o: Self) -> Self {
        Self::new(self.re * o.re - self.im * o.im, self.re * o.im + self.im * o.re)
    }
    fn div(self, o: Self) -> Self {
        let den = o.re * o.re + o.im * o.im;
        Self::new(
            (self.re * o.re + self.im * o.im) / den,
            (self.im * o.re - self.re * o.im) / den,
        )
    }
    fn abs(self) -> f64 {
        self.re.hypot(self.im)
    }
}

/// Largest modulus of the inverse roots of `1 + c[0] z + c[1] z^2 + ...`, i.e. of the roots of
/// `z^k + c[0] z^(k-1) + ... + c[k-1]` (the eigenvalues of its companion matrix). 0 for an
/// empty or all-zero polynomial. Uses the Durand-Kerner iteration, which converges for these
/// small degrees (at most 5); a non-converged result still bounds the answer well enough for
/// the near-unit-root screen it serves.
pub(super) fn max_inverse_root(c: &[f64]) -> f64 {
    let mut k = c.len();
    while k > 0 && c[k - 1] == 0.0 {
        k -= 1;
    }
    if k == 0 {
        return 0.0;
    }
    if k == 1 {
        return c[0].abs();
    }
    let coeffs = &c[..k];
    let eval = |z: Complex| -> Complex {
        let mut acc = Complex::new(1.0, 0.0);
        for a in coeffs {
            acc = acc.mul(z).add(Complex::new(*a, 0.0));
        }
        acc
    };
    let radius = 1.0 + coeffs.iter().fold(0.0_f64, |m, a| m.max(a.abs()));
    let seed = Complex::new(0.4, 0.9);
    let mut roots: Vec<Complex> = (0..k)
        .map(|i| {
            let mut z = Complex::new(1.0, 0.0);
            for _ in 0..i {
                z = z.mul(seed);
            }
            Complex::new(z.re * radius * 0.5, z.im * radius * 0.5)
        })
        .collect();
    for _ in 0..500 {
        let mut moved = 0.0_f64;
        for i in 0..k {
            let mut den = Complex::new(1.0, 0.0);
            for j in 0..k {
                if i != j {
                    den = den.mul(roots[i].sub(roots[j]));
                }
            }
            if den.abs() == 0.0 {
                den = Complex::new(1e-12, 0.0);
            }
            let step = eval(roots[i]).div(den);
            roots[i] = roots[i].sub(step);
            moved = moved.max(step.abs());
        }
        if moved < 1e-14 {
            break;
        }
    }
    roots.iter().map(|z| z.abs()).fold(0.0, f64::max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn solves_small_system() {
        let mut a = vec![2.0, 1.0, 1.0, 3.0];
        let mut b = vec![3.0, 5.0];
        solve(&mut a, &mut b, 2).unwrap();
        assert!((b[0] - 0.8).abs() < 1e-12 && (b[1] - 1.4).abs() < 1e-12);
    }

    #[test]
    fn singular_system_is_reported() {
        let mut a = vec![1.0, 2.0, 2.0, 4.0];
        let mut b = vec![1.0, 2.0];
        assert!(solve(&mut a, &mut b, 2).is_none());
    }

    #[test]
    fn least_squares_fits_a_line() {
        let rows: Vec<Vec<f64>> = (0..10).map(|i| vec![1.0, f64::from(i)]).collect();
        let y: Vec<f64> = (0..10).map(|i| 3.0 + 2.0 * f64::from(i)).collect();
        let c = least_squares(&rows, &y, 2);
        assert!((c[0] - 3.0).abs() < 1e-9 && (c[1] - 2.0).abs() < 1e-9, "{c:?}");
    }

    #[test]
    fn least_squares_rank_deficient_gives_min_norm() {
        let rows: Vec<Vec<f64>> = (0..5).map(|_| vec![1.0, 1.0]).collect();
        let y = vec![2.0; 5];
        let c = least_squares(&rows, &y, 2);
        assert!((c[0] - 1.0).abs() < 1e-9 && (c[1] - 1.0).abs() < 1e-9, "{c:?}");
    }

    #[test]
    fn inverse_roots() {
        // 1 - 0.5 z: root 2, inverse root 0.5.
        assert!((max_inverse_root(&[-0.5]) - 0.5).abs() < 1e-12);
        // (1 - 0.9 z)(1 + 0.5 z) = 1 - 0.4 z - 0.45 z^2.
        assert!((max_inverse_root(&[-0.4, -0.45]) - 0.9).abs() < 1e-9);
        // 1 + z^2: inverse roots +-i.
        assert!((max_inverse_root(&[0.0, 1.0]) - 1.0).abs() < 1e-9);
        assert_eq!(max_inverse_root(&[]), 0.0);
    }
}
