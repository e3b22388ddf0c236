//! One ARIMA(p,d,q) model with an optional intercept, estimated the way pmdarima's `ARIMA` does
//! it through statsmodels' `SARIMAX`:
//!
//! - the state-space form is SARIMAX's Harvey representation with the differencing kept in the
//!   state vector (`simple_differencing=False`): `d` integration states, then `max(p, q+1)` ARMA
//!   states; the intercept enters the first ARMA state, so with `d = 1` it is a drift;
//! - the integration states start "approximately diffuse" (mean 0, variance 1e6) and the first
//!   `d` observations are left out of the likelihood (`loglikelihood_burn = d`); the ARMA states
//!   start at their stationary mean and covariance;
//! - parameters are `[intercept?, ar.., ma.., sigma2]`, optimized in an unconstrained space
//!   (Monahan's transform keeps AR stationary and MA invertible, sigma2 is a square) with
//!   L-BFGS on `-loglike / nobs` and a forward-difference gradient (step 1e-5), 50 iterations at
//!   most, from the conditional-sum-of-squares start statsmodels computes.
//!
//! Following the same path rather than only the same model matters because pmdarima stops after
//! 50 iterations (and 5 on `update`), so where the optimizer starts and how it steps shows in the
//! forecasts.

use serde::{Deserialize, Serialize};

use super::ArimaError;
use super::lbfgs::{self, LbfgsOptions};
use super::linalg;

/// Variance of the approximately diffuse integration states (statsmodels `initial_variance`).
const DIFFUSE_VARIANCE: f64 = 1e6;
/// Largest state vector: d <= 2 and max(p, q + 1) <= 6 (p, q <= 5 in the search).
pub(super) const MAX_STATES: usize = 8;
/// Step of statsmodels' forward-difference gradient for L-BFGS (`epsilon=1e-5`).
const GRADIENT_STEP: f64 = 1e-5;

/// An ARIMA specification: orders and whether the model has an intercept (`trend='c'`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub(crate) struct ArimaSpec {
    pub p: usize,
    pub d: usize,
    pub q: usize,
    pub intercept: bool,
}

impl ArimaSpec {
    /// Number of estimated parameters, sigma2 included (the `k` of AIC).
    pub fn n_params(&self) -> usize {
        usize::from(self.intercept) + self.p + self.q + 1
    }

    fn arma_states(&self) -> usize {
        self.p.max(self.q + 1)
    }

    fn n_states(&self) -> usize {
        self.d + self.arma_states()
    }
}

/// Parameters on the model's own (constrained) scale.
#[derive(Clone, Debug, PartialEq)]
struct Params<'a> {
    intercept: f64,
    ar: &'a [f64],
    ma: &'a [f64],
    sigma2: f64,
}

fn split<'a>(spec: &ArimaSpec, params: &'a [f64]) -> Params<'a> {
    let mut at = 0;
    let intercept = if spec.intercept {
        at = 1;
        params[0]
    } else {
        0.0
    };
    let ar = &params[at..at + spec.p];
    let ma = &params[at + spec.p..at + spec.p + spec.q];
    Params {
        intercept,
        ar,
        ma,
        sigma2: params[at + spec.p + spec.q],
    }
}

/// A fitted model: the specification, its parameters and the information criteria.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct FittedArima {
    pub spec: ArimaSpec,
    /// `[intercept?, ar.., ma.., sigma2]`, constrained scale (as statsmodels' `params`).
    pub params: Vec<f64>,
    pub loglike: f64,
    pub aic: f64,
}

impl FittedArima {
    /// Inverse roots of the AR and MA polynomials, for pmdarima's near-unit-root test.
    pub fn max_inverse_roots(&self) -> (f64, f64) {
        let p = split(&self.spec, &self.params);
        let ar: Vec<f64> = p.ar.iter().map(|a| -a).collect();
        (linalg::max_inverse_root(&ar), linalg::max_inverse_root(p.ma))
    }
}

/// Output of one pass of the Kalman filter.
pub(super) struct FilterOutput {
    pub loglike: f64,
    /// One-step-ahead forecast after the last observation.
    pub forecast: f64,
}

/// Transition `T x` for the SARIMAX Harvey form, without materializing `T`: integration rows
/// sum the integration states at and below them plus the first ARMA state; ARMA rows are a
/// companion matrix (AR coefficients down the first column, ones on the superdiagonal).
#[inline]
fn apply_transition(d: usize, r: usize, ar: &[f64], x: &[f64; MAX_STATES], out: &mut [f64; MAX_STATES]) {
    let first_arma = x[d];
    let mut running = first_arma;
    for i in (0..d).rev() {
        running += x[i];
        out[i] = running;
    }
    for i in 0..r {
        let ar_term = if i < ar.len() { ar[i] * first_arma } else { 0.0 };
        let shift = if i + 1 < r { x[d + i + 1] } else { 0.0 };
        out[d + i] = ar_term + shift;
    }
}

/// Runs the Kalman filter of `spec` with `params` over `y`.
pub(super) fn filter(spec: &ArimaSpec, params: &[f64], y: &[f64]) -> Result<FilterOutput, ArimaError> {
    let m = spec.n_states();
    if m > MAX_STATES {
        return Err(ArimaError::OrderTooLarge);
    }
    let d = spec.d;
    let r = spec.arma_states();
    let p = split(spec, params);

    // Selection vector R (the ARMA innovation loads on the first ARMA state and, through the
    // MA coefficients, on the following ones).
    let mut selection = [0.0; MAX_STATES];
    selection[d] = 1.0;
    for (i, theta) in p.ma.iter().enumerate() {
        selection[d + 1 + i] = *theta;
    }

    // Initial state: integration states diffuse around 0, ARMA block stationary.
    let mut state = [0.0; MAX_STATES];
    let mut cov = [[0.0; MAX_STATES]; MAX_STATES];
    for (i, row) in cov.iter_mut().enumerate().take(d) {
        row[i] = DIFFUSE_VARIANCE;
    }
    let (arma_mean, arma_cov) = stationary_init(r, p.ar, &selection[d..d + r], p.intercept, p.sigma2)?;
    for i in 0..r {
        state[d + i] = arma_mean[i];
        for j in 0..r {
            cov[d + i][d + j] = arma_cov[i * r + j];
        }
    }

    let ln_2pi = (2.0 * std::f64::consts::PI).ln();
    let mut loglike = 0.0;
    let mut pz = [0.0; MAX_STATES];
    let mut tmp = [[0.0; MAX_STATES]; MAX_STATES];
    let mut row_out = [0.0; MAX_STATES];
    for (t, &obs) in y.iter().enumerate() {
        // Z = [1 (d times), 1, 0, ...]: the observation is the sum of the integration states
        // and the first ARMA state.
        let predicted: f64 = state[..=d].iter().sum();
        for i in 0..m {
            pz[i] = cov[i][..=d].iter().sum();
        }
        let variance: f64 = pz[..=d].iter().sum();
        if variance.is_nan() || variance <= 0.0 || !variance.is_finite() {
            return Err(ArimaError::Numerical("forecast error variance is not positive"));
        }
        let innovation = obs - predicted;
        if t >= d {
            loglike -= 0.5 * (ln_2pi + variance.ln() + innovation * innovation / variance);
        }
        // Update.
        let gain_scale = innovation / variance;
        for i in 0..m {
            state[i] += pz[i] * gain_scale;
        }
        for i in 0..m {
            for j in i..m {
                let v = cov[i][j] - pz[i] * pz[j] / variance;
                cov[i][j] = v;
                cov[j][i] = v;
            }
        }
        // Predict: a <- T a + c e_d ; P <- T P T' + sigma2 R R'.
        let current = state;
        apply_transition(d, r, p.ar, &current, &mut state);
        state[d] += p.intercept;
        // tmp = T P (column by column, P symmetric so columns are rows).
        for (j, row) in cov.iter().enumerate().take(m) {
            apply_transition(d, r, p.ar, row, &mut row_out);
            for i in 0..m {
                tmp[i][j] = row_out[i];
            }
        }
        // P = tmp T' : row i of P is T applied to row i of tmp.
        for i in 0..m {
            apply_transition(d, r, p.ar, &tmp[i], &mut row_out);
            cov[i][..m].copy_from_slice(&row_out[..m]);
        }
        for i in 0..m {
            for j in i..m {
                let v = 0.5 * (cov[i][j] + cov[j][i]) + p.sigma2 * selection[i] * selection[j];
                cov[i][j] = v;
                cov[j][i] = v;
            }
        }
    }
    let forecast: f64 = state[..=d].iter().sum();
    if !loglike.is_finite() || !forecast.is_finite() {
        return Err(ArimaError::Numerical("non-finite likelihood or forecast"));
    }
    Ok(FilterOutput { loglike, forecast })
}

/// Stationary mean and covariance of the ARMA block: `(I - T) mu = c e_1` and
/// `P = T P T' + sigma2 R R'` (solved as a linear system in `vec(P)`, at most 36 unknowns).
fn stationary_init(
    r: usize,
    ar: &[f64],
    selection: &[f64],
    intercept: f64,
    sigma2: f64,
) -> Result<(Vec<f64>, Vec<f64>), ArimaError> {
    let mut transition = vec![0.0; r * r];
    for (i, a) in ar.iter().enumerate() {
        transition[i * r] = *a;
    }
    for i in 0..r.saturating_sub(1) {
        transition[i * r + i + 1] = 1.0;
    }
    let mean = if intercept == 0.0 {
        vec![0.0; r]
    } else {
        let mut a = vec![0.0; r * r];
        for i in 0..r {
            for j in 0..r {
                a[i * r + j] = f64::from(u8::from(i == j)) - transition[i * r + j];
            }
        }
        let mut b = vec![0.0; r];
        b[0] = intercept;
        linalg::solve(&mut a, &mut b, r).ok_or(ArimaError::Numerical("singular stationary mean"))?;
        b
    };
    let n = r * r;
    let mut a = vec![0.0; n * n];
    let mut b = vec![0.0; n];
    // Row (i, j) of I - T (x) T.
    for i in 0..r {
        for j in 0..r {
            let row = i * r + j;
            a[row * n + row] += 1.0;
            for k in 0..r {
                let tik = transition[i * r + k];
                if tik == 0.0 {
                    continue;
                }
                for l in 0..r {
                    let tjl = transition[j * r + l];
                    if tjl != 0.0 {
                        a[row * n + k * r + l] -= tik * tjl;
                    }
                }
            }
            b[row] = sigma2 * selection[i] * selection[j];
        }
    }
    linalg::solve(&mut a, &mut b, n).ok_or(ArimaError::Numerical("singular stationary covariance"))?;
    Ok((mean, b))
}

/// Monahan's map from the real line to stationary AR coefficients (statsmodels
/// `constrain_stationary_univariate`).
fn constrain_stationary(unconstrained: &[f64], out: &mut [f64]) {
    let n = unconstrained.len();
    let mut prev = [0.0; 8];
    let mut cur = [0.0; 8];
    for k in 0..n {
        let u = unconstrained[k];
        let partial = u / (1.0 + u * u).sqrt();
        for i in 0..k {
            cur[i] = prev[i] + partial * prev[k - i - 1];
        }
        cur[k] = partial;
        prev[..=k].copy_from_slice(&cur[..=k]);
    }
    for i in 0..n {
        out[i] = -prev[i];
    }
}

/// Inverse of [`constrain_stationary`] (statsmodels `unconstrain_stationary_univariate`).
fn unconstrain_stationary(constrained: &[f64], out: &mut [f64]) {
    let n = constrained.len();
    if n == 0 {
        return;
    }
    let mut y = vec![vec![0.0; n]; n];
    for i in 0..n {
        y[n - 1][i] = -constrained[i];
    }
    for k in (1..n).rev() {
        let ykk = y[k][k];
        for i in 0..k {
            y[k - 1][i] = (y[k][i] - ykk * y[k][k - i - 1]) / (1.0 - ykk * ykk);
        }
    }
    for i in 0..n {
        let r = y[i][i];
        out[i] = r / (1.0 - r * r).sqrt();
    }
}

fn transform(spec: &ArimaSpec, unconstrained: &[f64], out: &mut [f64]) {
    let mut at = 0;
    if spec.intercept {
        out[0] = unconstrained[0];
        at = 1;
    }
    constrain_stationary(&unconstrained[at..at + spec.p], &mut out[at..at + spec.p]);
    at += spec.p;
    constrain_stationary(&unconstrained[at..at + spec.q], &mut out[at..at + spec.q]);
    for v in &mut out[at..at + spec.q] {
        *v = -*v;
    }
    at += spec.q;
    out[at] = unconstrained[at] * unconstrained[at];
}

fn untransform(spec: &ArimaSpec, constrained: &[f64]) -> Vec<f64> {
    let mut out = vec![0.0; constrained.len()];
    let mut at = 0;
    if spec.intercept {
        out[0] = constrained[0];
        at = 1;
    }
    unconstrain_stationary(&constrained[at..at + spec.p], &mut out[at..at + spec.p]);
    at += spec.p;
    let negated_ma: Vec<f64> = constrained[at..at + spec.q].iter().map(|v| -v).collect();
    unconstrain_stationary(&negated_ma, &mut out[at..at + spec.q]);
    at += spec.q;
    out[at] = constrained[at].sqrt();
    out
}

/// `d`-th difference.
pub(super) fn difference(y: &[f64], d: usize) -> Vec<f64> {
    let mut out = y.to_vec();
    for _ in 0..d {
        out = out.windows(2).map(|w| w[1] - w[0]).collect();
    }
    out
}

/// statsmodels' `lagmat(x, maxlag)` rows `from..x.len()`: `[x[t-1], .., x[t-maxlag]]`, zero before
/// the start.
fn lag_columns(x: &[f64], maxlag: usize, from: usize) -> Vec<Vec<f64>> {
    (from..x.len())
        .map(|t| {
            (1..=maxlag)
                .map(|lag| if t >= lag { x[t - lag] } else { 0.0 })
                .collect()
        })
        .collect()
}

/// Starting parameters exactly as statsmodels' `SARIMAX.start_params`: least squares of the
/// differenced series on its own lags and on the residuals of a long autoregression (a
/// conditional-sum-of-squares estimate), zeroed when non-stationary or non-invertible.
fn start_params(spec: &ArimaSpec, y: &[f64]) -> Vec<f64> {
    let w = difference(y, spec.d);
    let (p, q) = (spec.p, spec.q);
    let k_trend = usize::from(spec.intercept);
    let mut trend = Vec::new();
    let mut ar = Vec::new();
    let mut ma = Vec::new();
    let mut variance: Option<f64> = None;
    if p + q + k_trend > 0 {
        match css_estimates(&w, p, q, k_trend) {
            Some((params, residuals)) => {
                trend = params[..k_trend].to_vec();
                ar = params[k_trend..k_trend + p].to_vec();
                ma = params[k_trend + p..].to_vec();
                variance = Some(residual_variance(&residuals, q, &w));
            }
            None => {
                // statsmodels: too few observations, all zeros and the variance of the
                // demeaned series.
                trend = vec![0.0; k_trend];
                ar = vec![0.0; p];
                ma = vec![0.0; q];
                let mean = if w.is_empty() {
                    0.0
                } else {
                    w.iter().sum::<f64>() / w.len() as f64
                };
                let mut residuals = vec![0.0; 2 * q];
                residuals.extend(w.iter().map(|v| v - mean));
                if w.is_empty() {
                    residuals = vec![1.0; 2 * q + 1];
                }
                variance = Some(residual_variance(&residuals, q, &w));
            }
        }
    }
    let neg_ar: Vec<f64> = ar.iter().map(|a| -a).collect();
    if p > 0 && linalg::max_inverse_root(&neg_ar) >= 1.0 {
        ar.iter_mut().for_each(|a| *a = 0.0);
    }
    if q > 0 && linalg::max_inverse_root(&ma) >= 1.0 {
        ma.iter_mut().for_each(|m| *m = 0.0);
    }
    let variance = variance.unwrap_or_else(|| w.iter().map(|v| v * v).sum::<f64>() / y.len() as f64);
    let mut out = trend;
    out.extend(ar);
    out.extend(ma);
    out.push(variance.max(1e-10));
    out
}

fn residual_variance(residuals: &[f64], q: usize, w: &[f64]) -> f64 {
    if residuals.len() > q.max(1) {
        let tail = &residuals[q..];
        tail.iter().map(|e| e * e).sum::<f64>() / tail.len() as f64
    } else if w.is_empty() {
        1.0
    } else {
        let mean = w.iter().sum::<f64>() / w.len() as f64;
        w.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / w.len() as f64
    }
}

/// `(params, residuals)` of statsmodels' `_conditional_sum_squares`, or `None` where it hits
/// its "too few observations" branch.
fn css_estimates(w: &[f64], p: usize, q: usize, k_trend: usize) -> Option<(Vec<f64>, Vec<f64>)> {
    let k = 2 * q;
    let r = (k + q).max(p);
    let mut residuals: Vec<f64> = Vec::new();
    if q > 0 {
        if k >= w.len() {
            return None;
        }
        let targets = &w[k..];
        let rows = lag_columns(w, k, k);
        let coef = linalg::least_squares(&rows, targets, k);
        residuals = rows
            .iter()
            .zip(targets)
            .map(|(row, t)| t - row.iter().zip(&coef).map(|(a, b)| a * b).sum::<f64>())
            .collect();
    }
    // statsmodels' `lagmat` raises (its "too few observations" branch) when a lag reaches the
    // series length; a merely empty regression (r >= len) is not an error there.
    if (p > 0 && p >= w.len()) || (q > 0 && q >= residuals.len()) {
        return None;
    }
    let targets = &w[r.min(w.len())..];
    let ar_lags = lag_columns(w, p, r);
    let ma_lags = if q > 0 {
        lag_columns(&residuals, q, r - k)
    } else {
        Vec::new()
    };
    let cols = k_trend + p + q;
    let rows: Vec<Vec<f64>> = (0..targets.len())
        .map(|i| {
            let mut row = Vec::with_capacity(cols);
            row.extend(std::iter::repeat_n(1.0, k_trend));
            row.extend_from_slice(&ar_lags[i]);
            if q > 0 {
                row.extend_from_slice(&ma_lags[i]);
            }
            row
        })
        .collect();
    let coef = linalg::least_squares(&rows, targets, cols);
    let residuals = rows
        .iter()
        .zip(targets)
        .map(|(row, t)| t - row.iter().zip(&coef).map(|(a, b)| a * b).sum::<f64>())
        .collect();
    Some((coef, residuals))
}

/// How long the optimizer may run.
#[derive(Clone, Copy, Debug)]
pub(super) struct FitOptions {
    pub max_iterations: usize,
}

/// Maximum-likelihood fit of `spec` on `y`, from `start` (constrained scale) or statsmodels'
/// own starting values.
pub(super) fn fit(
    spec: &ArimaSpec,
    y: &[f64],
    start: Option<&[f64]>,
    options: FitOptions,
) -> Result<FittedArima, ArimaError> {
    if spec.n_states() > MAX_STATES {
        return Err(ArimaError::OrderTooLarge);
    }
    if y.is_empty() {
        return Err(ArimaError::TooShort);
    }
    let start = match start {
        Some(s) if s.len() == spec.n_params() => s.to_vec(),
        _ => start_params(spec, y),
    };
    if start.iter().any(|v| !v.is_finite()) {
        return Err(ArimaError::Numerical("non-finite starting parameters"));
    }
    let x0 = untransform(spec, &start);
    let nobs = y.len() as f64;
    let mut scratch = vec![0.0; x0.len()];
    let mut objective = |x: &[f64]| -> f64 {
        transform(spec, x, &mut scratch);
        match filter(spec, &scratch, y) {
            Ok(out) => -out.loglike / nobs,
            Err(_) => f64::NAN,
        }
    };
    let options = LbfgsOptions {
        max_iterations: options.max_iterations,
        gradient_step: GRADIENT_STEP,
    };
    let solution = lbfgs::minimize(&mut objective, &x0, &options)?;
    let mut params = vec![0.0; x0.len()];
    transform(spec, &solution, &mut params);
    let out = filter(spec, &params, y)?;
    let aic = -2.0 * out.loglike + 2.0 * spec.n_params() as f64;
    Ok(FittedArima {
        spec: *spec,
        params,
        loglike: out.loglike,
        aic,
    })
}

/// One-step-ahead forecast of a fitted model whose history is `y`.
pub(super) fn forecast(fitted: &FittedArima, y: &[f64]) -> Result<f64, ArimaError> {
    Ok(filter(&fitted.spec, &fitted.params, y)?.forecast)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transform_round_trips() {
        let spec = ArimaSpec {
            p: 3,
            d: 1,
            q: 2,
            intercept: true,
        };
        let constrained = [0.7, 0.5, -0.2, 0.1, 0.3, -0.25, 4.0];
        let unconstrained = untransform(&spec, &constrained);
        let mut back = vec![0.0; constrained.len()];
        transform(&spec, &unconstrained, &mut back);
        for (a, b) in constrained.iter().zip(&back) {
            assert!((a - b).abs() < 1e-12, "{constrained:?} vs {back:?}");
        }
    }

    #[test]
    fn white_noise_likelihood_matches_closed_form() {
        // ARIMA(0,0,0) with intercept: iid N(c, sigma2).
        let spec = ArimaSpec {
            p: 0,
            d: 0,
            q: 0,
            intercept: true,
        };
        let y = [1.0, 2.0, 4.0, 3.0];
        let (c, s2) = (2.5, 1.5);
        let out = filter(&spec, &[c, s2], &y).unwrap();
        let expected: f64 = y
            .iter()
            .map(|v| -0.5 * ((2.0 * std::f64::consts::PI).ln() + s2.ln() + (v - c) * (v - c) / s2))
            .sum();
        assert!((out.loglike - expected).abs() < 1e-12);
        assert!((out.forecast - c).abs() < 1e-12);
    }

    #[test]
    fn ar1_forecast_is_mean_reverting() {
        let spec = ArimaSpec {
            p: 1,
            d: 0,
            q: 0,
            intercept: true,
        };
        let y = [10.0, 12.0, 11.0];
        // y_t = 2 + 0.8 y_{t-1} + e_t: forecast = 2 + 0.8 * 11.
        let out = filter(&spec, &[2.0, 0.8, 1.0], &y).unwrap();
        assert!((out.forecast - 10.8).abs() < 1e-9, "{}", out.forecast);
    }

    #[test]
    fn random_walk_with_drift_forecast() {
        let spec = ArimaSpec {
            p: 0,
            d: 1,
            q: 0,
            intercept: true,
        };
        let y = [10.0, 12.0, 13.0, 15.0];
        let out = filter(&spec, &[1.5, 1.0], &y).unwrap();
        assert!((out.forecast - 16.5).abs() < 1e-3, "{}", out.forecast);
    }
}
