//! Unconstrained L-BFGS as SciPy's `fmin_l_bfgs_b` runs it for statsmodels (no bounds, memory
//! 10, `factr=1e7`, `pgtol=1e-5`, at most 20 evaluations per line search, forward-difference
//! gradient), with the MINPACK-2 `dcsrch` line search (Moré-Thuente, `ftol=1e-3`, `gtol=0.9`,
//! `xtol=0.1`).
//!
//! Without bounds L-BFGS-B's Cauchy point and subspace minimization reduce to the ordinary
//! two-loop recursion with `H0 = (s'y / y'y) I`; what else makes it L-BFGS-B (the first step of
//! length `1/|d|`, the curvature test that skips updates, the memory reset after a failed line
//! search, the stopping tests) is reproduced here. pmdarima stops the optimizer after 50
//! iterations (5 on `update`), so matching its path and not only its optimum keeps the forecasts
//! close.

use std::collections::VecDeque;

use super::ArimaError;

const MEMORY: usize = 10;
const FACTR: f64 = 1e7;
const PGTOL: f64 = 1e-5;
const MAX_LINE_SEARCH_EVALUATIONS: usize = 20;
const LS_FTOL: f64 = 1e-3;
const LS_GTOL: f64 = 0.9;
const LS_XTOL: f64 = 0.1;
const STEP_MAX: f64 = 1e10;

/// Stopping rule and gradient step.
#[derive(Clone, Copy, Debug)]
pub(super) struct LbfgsOptions {
    pub max_iterations: usize,
    pub gradient_step: f64,
}

/// `f` and its forward-difference gradient, exactly as SciPy's `approx_derivative` with an
/// absolute step: `(f(x + h e_i) - f(x)) / ((x_i + h) - x_i)`.
fn value_and_gradient(f: &mut dyn FnMut(&[f64]) -> f64, x: &[f64], step: f64, grad: &mut [f64]) -> f64 {
    let fx = f(x);
    let mut probe = x.to_vec();
    for i in 0..x.len() {
        let original = probe[i];
        probe[i] = original + step;
        let dx = probe[i] - original;
        grad[i] = (f(&probe) - fx) / dx;
        probe[i] = original;
    }
    fx
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

fn max_abs(a: &[f64]) -> f64 {
    a.iter().fold(0.0, |m, v| m.max(v.abs()))
}

/// Minimizes `f` from `x0`. Returns the last accepted point (as SciPy does when it stops on the
/// iteration limit or an abnormal line search); fails only when `f(x0)` is not finite.
pub(super) fn minimize(
    f: &mut dyn FnMut(&[f64]) -> f64,
    x0: &[f64],
    options: &LbfgsOptions,
) -> Result<Vec<f64>, ArimaError> {
    let n = x0.len();
    let mut x = x0.to_vec();
    let mut g = vec![0.0; n];
    let mut fx = value_and_gradient(f, &x, options.gradient_step, &mut g);
    if !fx.is_finite() || g.iter().any(|v| !v.is_finite()) {
        return Err(ArimaError::Numerical(
            "objective not finite at the starting parameters",
        ));
    }
    if max_abs(&g) <= PGTOL {
        return Ok(x);
    }
    let tol = FACTR * f64::EPSILON;
    let mut memory: VecDeque<(Vec<f64>, Vec<f64>, f64)> = VecDeque::with_capacity(MEMORY);
    let mut theta = 1.0;
    let mut iteration = 0;
    let mut trial = vec![0.0; n];
    let mut trial_g = vec![0.0; n];
    while iteration < options.max_iterations {
        let d = direction(&g, &memory, theta);
        let gd = dot(&g, &d);
        if gd.is_nan() || gd >= 0.0 {
            // Not a descent direction: start the memory afresh, or give up if it already is.
            if memory.is_empty() {
                return Ok(x);
            }
            memory.clear();
            theta = 1.0;
            continue;
        }
        let dnorm = dot(&d, &d).sqrt();
        let mut stp = if iteration == 0 {
            (1.0 / dnorm).min(STEP_MAX)
        } else {
            1.0
        };
        let mut search = LineSearch::start(fx, gd, stp);
        let mut evaluations = 0;
        let mut accepted = false;
        let mut trial_f = fx;
        while evaluations < MAX_LINE_SEARCH_EVALUATIONS {
            for i in 0..n {
                trial[i] = x[i] + stp * d[i];
            }
            trial_f = value_and_gradient(f, &trial, options.gradient_step, &mut trial_g);
            evaluations += 1;
            if !trial_f.is_finite() || trial_g.iter().any(|v| !v.is_finite()) {
                // Outside where the likelihood can be evaluated: step back towards x.
                stp *= 0.5;
                continue;
            }
            let trial_gd = dot(&trial_g, &d);
            match search.next(trial_f, trial_gd, stp) {
                LineSearchStep::Done => {
                    accepted = true;
                    break;
                }
                LineSearchStep::Evaluate(next) => stp = next,
            }
        }
        if !accepted {
            if memory.is_empty() {
                return Ok(x);
            }
            memory.clear();
            theta = 1.0;
            continue;
        }
        iteration += 1;
        let s: Vec<f64> = trial.iter().zip(&x).map(|(a, b)| a - b).collect();
        let y: Vec<f64> = trial_g.iter().zip(&g).map(|(a, b)| a - b).collect();
        let f_old = fx;
        x.copy_from_slice(&trial);
        g.copy_from_slice(&trial_g);
        fx = trial_f;
        if max_abs(&g) <= PGTOL {
            break;
        }
        if f_old - fx <= tol * f_old.abs().max(fx.abs()).max(1.0) {
            break;
        }
        let sy = dot(&s, &y);
        let curvature_floor = f64::EPSILON * (-gd * stp);
        if sy > curvature_floor {
            if memory.len() == MEMORY {
                memory.pop_front();
            }
            theta = dot(&y, &y) / sy;
            memory.push_back((s, y, 1.0 / sy));
        }
    }
    Ok(x)
}

/// `-H g` by the two-loop recursion, `H0 = I / theta`.
fn direction(g: &[f64], memory: &VecDeque<(Vec<f64>, Vec<f64>, f64)>, theta: f64) -> Vec<f64> {
    let mut q = g.to_vec();
    let mut alphas = Vec::with_capacity(memory.len());
    for (s, y, rho) in memory.iter().rev() {
        let alpha = rho * dot(s, &q);
        for (qi, yi) in q.iter_mut().zip(y) {
            *qi -= alpha * yi;
        }
        alphas.push(alpha);
    }
    for v in &mut q {
        *v /= theta;
    }
    for ((s, y, rho), alpha) in memory.iter().zip(alphas.iter().rev()) {
        let beta = rho * dot(y, &q);
        for (qi, si) in q.iter_mut().zip(s) {
            *qi += si * (alpha - beta);
        }
    }
    q.iter().map(|v| -v).collect()
}

enum LineSearchStep {
    Done,
    Evaluate(f64),
}

/// MINPACK-2 `dcsrch`: finds a step satisfying the strong Wolfe conditions.
struct LineSearch {
    finit: f64,
    ginit: f64,
    gtest: f64,
    stage_one: bool,
    brackt: bool,
    width: f64,
    width1: f64,
    stx: f64,
    fx: f64,
    gx: f64,
    sty: f64,
    fy: f64,
    gy: f64,
    stmin: f64,
    stmax: f64,
}

const XTRAPL: f64 = 1.1;
const XTRAPU: f64 = 4.0;

impl LineSearch {
    fn start(f: f64, g: f64, stp: f64) -> Self {
        Self {
            finit: f,
            ginit: g,
            gtest: LS_FTOL * g,
            stage_one: true,
            brackt: false,
            width: STEP_MAX,
            width1: 2.0 * STEP_MAX,
            stx: 0.0,
            fx: f,
            gx: g,
            sty: 0.0,
            fy: f,
            gy: g,
            stmin: 0.0,
            stmax: stp + XTRAPU * stp,
        }
    }

    fn next(&mut self, f: f64, g: f64, stp: f64) -> LineSearchStep {
        let ftest = self.finit + stp * self.gtest;
        if self.stage_one && f <= ftest && g >= 0.0 {
            self.stage_one = false;
        }
        // Warnings end the search with the current step, as in dcsrch.
        if self.brackt && (stp <= self.stmin || stp >= self.stmax) {
            return LineSearchStep::Done;
        }
        if self.brackt && self.stmax - self.stmin <= LS_XTOL * self.stmax {
            return LineSearchStep::Done;
        }
        if stp == STEP_MAX && f <= ftest && g <= self.gtest {
            return LineSearchStep::Done;
        }
        if stp == 0.0 && (f > ftest || g >= self.gtest) {
            return LineSearchStep::Done;
        }
        if f <= ftest && g.abs() <= LS_GTOL * (-self.ginit) {
            return LineSearchStep::Done;
        }
        let mut new_stp = stp;
        if self.stage_one && f <= self.fx && f > ftest {
            let fm = f - stp * self.gtest;
            let mut fxm = self.fx - self.stx * self.gtest;
            let mut fym = self.fy - self.sty * self.gtest;
            let gm = g - self.gtest;
            let mut gxm = self.gx - self.gtest;
            let mut gym = self.gy - self.gtest;
            dcstep(
                &mut self.stx,
                &mut fxm,
                &mut gxm,
                &mut self.sty,
                &mut fym,
                &mut gym,
                &mut new_stp,
                fm,
                gm,
                &mut self.brackt,
                self.stmin,
                self.stmax,
            );
            self.fx = fxm + self.stx * self.gtest;
            self.fy = fym + self.sty * self.gtest;
            self.gx = gxm + self.gtest;
            self.gy = gym + self.gtest;
        } else {
            dcstep(
                &mut self.stx,
                &mut self.fx,
                &mut self.gx,
                &mut self.sty,
                &mut self.fy,
                &mut self.gy,
                &mut new_stp,
                f,
                g,
                &mut self.brackt,
                self.stmin,
                self.stmax,
            );
        }
        if self.brackt {
            if (self.sty - self.stx).abs() >= 0.66 * self.width1 {
                new_stp = self.stx + 0.5 * (self.sty - self.stx);
            }
            self.width1 = self.width;
            self.width = (self.sty - self.stx).abs();
            self.stmin = self.stx.min(self.sty);
            self.stmax = self.stx.max(self.sty);
        } else {
            self.stmin = new_stp + XTRAPL * (new_stp - self.stx);
            self.stmax = new_stp + XTRAPU * (new_stp - self.stx);
        }
        new_stp = new_stp.clamp(0.0, STEP_MAX);
        if self.brackt
            && (new_stp <= self.stmin
                || new_stp >= self.stmax
                || self.stmax - self.stmin <= LS_XTOL * self.stmax)
        {
            new_stp = self.stx;
        }
        LineSearchStep::Evaluate(new_stp)
    }
}

/// MINPACK-2 `dcstep`: safeguarded cubic/quadratic step and interval update.
#[allow(clippy::too_many_arguments)]
fn dcstep(
    stx: &mut f64,
    fx: &mut f64,
    dx: &mut f64,
    sty: &mut f64,
    fy: &mut f64,
    dy: &mut f64,
    stp: &mut f64,
    fp: f64,
    dp: f64,
    brackt: &mut bool,
    stpmin: f64,
    stpmax: f64,
) {
    let sgnd = dp * (*dx / dx.abs());
    let stpf;
    if fp > *fx {
        let theta = 3.0 * (*fx - fp) / (*stp - *stx) + *dx + dp;
        let s = theta.abs().max(dx.abs()).max(dp.abs());
        let mut gamma = s * ((theta / s).powi(2) - (*dx / s) * (dp / s)).sqrt();
        if *stp < *stx {
            gamma = -gamma;
        }
        let p = (gamma - *dx) + theta;
        let q = ((gamma - *dx) + gamma) + dp;
        let r = p / q;
        let stpc = *stx + r * (*stp - *stx);
        let stpq = *stx + ((*dx / ((*fx - fp) / (*stp - *stx) + *dx)) / 2.0) * (*stp - *stx);
        stpf = if (stpc - *stx).abs() < (stpq - *stx).abs() {
            stpc
        } else {
            stpc + (stpq - stpc) / 2.0
        };
        *brackt = true;
    } else if sgnd < 0.0 {
        let theta = 3.0 * (*fx - fp) / (*stp - *stx) + *dx + dp;
        let s = theta.abs().max(dx.abs()).max(dp.abs());
        let mut gamma = s * ((theta / s).powi(2) - (*dx / s) * (dp / s)).sqrt();
        if *stp > *stx {
            gamma = -gamma;
        }
        let p = (gamma - dp) + theta;
        let q = ((gamma - dp) + gamma) + *dx;
        let r = p / q;
        let stpc = *stp + r * (*stx - *stp);
        let stpq = *stp + (dp / (dp - *dx)) * (*stx - *stp);
        stpf = if (stpc - *stp).abs() > (stpq - *stp).abs() {
            stpc
        } else {
            stpq
        };
        *brackt = true;
    } else if dp.abs() < dx.abs() {
        let theta = 3.0 * (*fx - fp) / (*stp - *stx) + *dx + dp;
        let s = theta.abs().max(dx.abs()).max(dp.abs());
        let mut gamma = s * ((theta / s).powi(2) - (*dx / s) * (dp / s)).max(0.0).sqrt();
        if *stp > *stx {
            gamma = -gamma;
        }
        let p = (gamma - dp) + theta;
        let q = (gamma + (*dx - dp)) + gamma;
        let r = p / q;
        let stpc = if r < 0.0 && gamma != 0.0 {
            *stp + r * (*stx - *stp)
        } else if *stp > *stx {
            stpmax
        } else {
            stpmin
        };
        let stpq = *stp + (dp / (dp - *dx)) * (*stx - *stp);
        if *brackt {
            let mut candidate = if (stpc - *stp).abs() < (stpq - *stp).abs() {
                stpc
            } else {
                stpq
            };
            if *stp > *stx {
                candidate = candidate.min(*stp + 0.66 * (*sty - *stp));
            } else {
                candidate = candidate.max(*stp + 0.66 * (*sty - *stp));
            }
            stpf = candidate;
        } else {
            let candidate = if (stpc - *stp).abs() > (stpq - *stp).abs() {
                stpc
            } else {
                stpq
            };
            stpf = candidate.min(stpmax).max(stpmin);
        }
    } else if *brackt {
        let theta = 3.0 * (fp - *fy) / (*sty - *stp) + *dy + dp;
        let s = theta.abs().max(dy.abs()).max(dp.abs());
        let mut gamma = s * ((theta / s).powi(2) - (*dy / s) * (dp / s)).sqrt();
        if *stp > *sty {
            gamma = -gamma;
        }
        let p = (gamma - dp) + theta;
        let q = ((gamma - dp) + gamma) + *dy;
        let r = p / q;
        stpf = *stp + r * (*sty - *stp);
    } else if *stp > *stx {
        stpf = stpmax;
    } else {
        stpf = stpmin;
    }
    if fp > *fx {
        *sty = *stp;
        *fy = fp;
        *dy = dp;
    } else {
        if sgnd < 0.0 {
            *sty = *stx;
            *fy = *fx;
            *dy = *dx;
        }
        *stx = *stp;
        *fx = fp;
        *dx = dp;
    }
    *stp = stpf;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minimizes_rosenbrock() {
        let mut f = |x: &[f64]| (1.0 - x[0]).powi(2) + 100.0 * (x[1] - x[0] * x[0]).powi(2);
        let options = LbfgsOptions {
            max_iterations: 200,
            gradient_step: 1e-8,
        };
        let x = minimize(&mut f, &[-1.2, 1.0], &options).unwrap();
        assert!((x[0] - 1.0).abs() < 1e-3 && (x[1] - 1.0).abs() < 1e-3, "{x:?}");
    }

    #[test]
    fn minimizes_quadratic_in_few_iterations() {
        let mut f = |x: &[f64]| 3.0 * (x[0] - 2.0).powi(2) + 0.5 * (x[1] + 1.0).powi(2) + x[0] * x[1];
        let options = LbfgsOptions {
            max_iterations: 50,
            gradient_step: 1e-7,
        };
        let x = minimize(&mut f, &[0.0, 0.0], &options).unwrap();
        // Gradient zero: 6(x0-2) + x1 = 0, (x1+1) + x0 = 0.
        assert!(
            (6.0 * (x[0] - 2.0) + x[1]).abs() < 1e-4 && (x[1] + 1.0 + x[0]).abs() < 1e-4,
            "{x:?}"
        );
    }

    #[test]
    fn non_finite_start_is_an_error() {
        let mut f = |_: &[f64]| f64::NAN;
        let options = LbfgsOptions {
            max_iterations: 5,
            gradient_step: 1e-5,
        };
        assert!(minimize(&mut f, &[0.0], &options).is_err());
    }
}
