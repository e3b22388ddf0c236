//! `auto_arima` with pmdarima 2.1.1's defaults for a non-seasonal series: `d` by repeated KPSS
//! tests (level null, short lag, alpha 0.05, at most 2), then the stepwise Hyndman-Khandakar
//! search by AIC over `p, q <= 5` (and `<= n/3`), starting from (2,d,2), with the intercept
//! decided as pmdarima decides it, candidates whose AR or MA inverse roots come within 0.01 of
//! the unit circle rejected, at most 100 fits; the lowest AIC wins.

use std::collections::HashMap;

use super::ArimaError;
use super::model::{self, ArimaSpec, FitOptions, FittedArima};

const MAX_P: usize = 5;
const MAX_Q: usize = 5;
const MAX_D: usize = 2;
const START_P: usize = 2;
const START_Q: usize = 2;
const KPSS_ALPHA: f64 = 0.05;
const MAX_FITS: usize = 100;
/// pmdarima's `auto_arima(maxiter=50)`.
pub(super) const FIT_ITERATIONS: usize = 50;

/// pmdarima's `is_constant`: every element equals the first.
pub(super) fn is_constant(x: &[f64]) -> bool {
    x.first().is_none_or(|first| x.iter().all(|v| v == first))
}

/// KPSS test of level stationarity (pmdarima `KPSSTest(null='level', lshort=True)`): the p-value
/// interpolated in the KPSS table, clamped to [0.01, 0.10].
fn kpss_pvalue(x: &[f64]) -> f64 {
    let n = x.len();
    let nf = n as f64;
    let mean = x.iter().sum::<f64>() / nf;
    let residuals: Vec<f64> = x.iter().map(|v| v - mean).collect();
    let mut cumulative = 0.0;
    let mut eta = 0.0;
    for e in &residuals {
        cumulative += e;
        eta += cumulative * cumulative;
    }
    eta /= nf * nf;
    let mut long_run = residuals.iter().map(|e| e * e).sum::<f64>() / nf;
    let lags = (4.0 * (nf / 100.0).powf(0.25)).trunc() as usize;
    // Newey-West with Bartlett weights (R tseries' `tseries_pp_sum`).
    let mut extra = 0.0;
    for lag in 1..=lags {
        let mut acc = 0.0;
        for j in lag..n {
            acc += residuals[j] * residuals[j - lag];
        }
        extra += acc * (1.0 - lag as f64 / (lags as f64 + 1.0));
    }
    long_run += 2.0 * extra / nf;
    let stat = eta / long_run;
    // R's table for the level null, as (statistic, p-value) with the statistic ascending.
    const TABLE: [(f64, f64); 4] = [(0.347, 0.10), (0.463, 0.05), (0.574, 0.025), (0.739, 0.01)];
    if !stat.is_finite() {
        return f64::NAN;
    }
    if stat <= TABLE[0].0 {
        return TABLE[0].1;
    }
    if stat >= TABLE[3].0 {
        return TABLE[3].1;
    }
    for pair in TABLE.windows(2) {
        let ((x0, y0), (x1, y1)) = (pair[0], pair[1]);
        if stat <= x1 {
            return y0 + (y1 - y0) * (stat - x0) / (x1 - x0);
        }
    }
    TABLE[3].1
}

/// pmdarima `ndiffs(test='kpss', alpha=0.05, max_d=2)`.
pub(super) fn ndiffs(y: &[f64]) -> usize {
    let mut x = y.to_vec();
    if x.is_empty() || is_constant(&x) {
        return 0;
    }
    let pvalue = kpss_pvalue(&x);
    if pvalue.is_nan() {
        return 0;
    }
    let mut should_diff = pvalue < KPSS_ALPHA;
    let mut d = 0;
    while should_diff && d < MAX_D {
        d += 1;
        x = model::difference(&x, 1);
        if x.is_empty() {
            return d - 1;
        }
        if is_constant(&x) {
            return d;
        }
        let pvalue = kpss_pvalue(&x);
        if pvalue.is_nan() {
            return d - 1;
        }
        should_diff = pvalue < KPSS_ALPHA;
    }
    d
}

/// One candidate's outcome.
struct Candidate {
    fit: Option<FittedArima>,
    aic: f64,
}

/// pmdarima's `_fit_candidate_model`: fit, score by AIC, and set the score to infinity when an
/// inverse root comes within 0.01 of the unit circle. (pmdarima's test overwrites the AR
/// figure with the MA one when the model has MA terms; reproduced, as it decides which models
/// survive.)
fn fit_candidate(spec: ArimaSpec, y: &[f64]) -> Candidate {
    match model::fit(
        &spec,
        y,
        None,
        FitOptions {
            max_iterations: FIT_ITERATIONS,
        },
    ) {
        Ok(fit) => {
            let (ar_root, ma_root) = fit.max_inverse_roots();
            let mut worst = 0.0_f64;
            if spec.p > 0 {
                worst = ar_root;
            }
            if spec.q > 0 && fit.aic.is_finite() {
                worst = ma_root;
            }
            let aic = if worst > 1.0 - 1e-2 {
                f64::INFINITY
            } else {
                fit.aic
            };
            Candidate { fit: Some(fit), aic }
        }
        Err(_) => Candidate {
            fit: None,
            aic: f64::INFINITY,
        },
    }
}

/// State of pmdarima's `_StepwiseFitWrapper`.
struct Stepwise<'a> {
    y: &'a [f64],
    d: usize,
    intercept: bool,
    fits: usize,
    /// Insertion-ordered results, so ties resolve as pmdarima's stable sort does.
    results: Vec<(ArimaSpec, Candidate)>,
    seen: HashMap<ArimaSpec, usize>,
    best: Option<usize>,
}

impl Stepwise<'_> {
    /// pmdarima `_do_fit`: fits an unseen candidate; `true` when it is the new best.
    fn try_fit(&mut self, p: usize, q: usize, intercept: Option<bool>) -> bool {
        let spec = ArimaSpec {
            p,
            d: self.d,
            q,
            intercept: intercept.unwrap_or(self.intercept),
        };
        if self.seen.contains_key(&spec) {
            return false;
        }
        self.fits += 1;
        let candidate = fit_candidate(spec, self.y);
        let aic = candidate.aic;
        let usable = candidate.fit.is_some() && aic.is_finite();
        self.seen.insert(spec, self.results.len());
        self.results.push((spec, candidate));
        if !usable {
            return false;
        }
        let index = self.results.len() - 1;
        match self.best {
            None => {
                self.best = Some(index);
                true
            }
            Some(best) if aic < self.results[best].1.aic => {
                self.best = Some(index);
                true
            }
            Some(_) => false,
        }
    }

    fn can_fit(&self) -> bool {
        self.fits < MAX_FITS
    }
}

/// pmdarima `auto_arima(y, suppress_warnings=True, error_action="ignore")` for `m = 1`.
pub(super) fn auto_arima(y: &[f64]) -> Result<FittedArima, ArimaError> {
    let n = y.len();
    if n == 0 {
        return Err(ArimaError::TooShort);
    }
    if is_constant(y) {
        let spec = ArimaSpec {
            p: 0,
            d: 0,
            q: 0,
            intercept: false,
        };
        return best_of(vec![(spec, fit_candidate(spec, y))]);
    }
    let max_p = MAX_P.min(n / 3);
    let max_q = MAX_Q.min(n / 3);
    let mut start_p = START_P.min(max_p);
    let mut start_q = START_Q.min(max_q);
    let d = ndiffs(y);
    let dx = model::difference(y, d);
    if is_constant(&dx) {
        // A polynomial of degree d (pmdarima fits (0,d,0), with an intercept when d < 2). The
        // fit is degenerate (zero variance); the caller extrapolates such series exactly.
        let spec = ArimaSpec {
            p: 0,
            d,
            q: 0,
            intercept: d < 2,
        };
        return best_of(vec![(spec, fit_candidate(spec, y))]);
    }
    let intercept = d <= 1;
    if n < 10 {
        start_p = start_p.min(1);
        start_q = start_q.min(1);
    }
    let mut p = start_p.min(max_p);
    let mut q = start_q.min(max_q);
    let mut search = Stepwise {
        y,
        d,
        intercept,
        fits: 0,
        results: Vec::new(),
        seen: HashMap::new(),
        best: None,
    };

    search.try_fit(p, q, None);
    if search.try_fit(0, 0, None) {
        p = 0;
        q = 0;
    }
    if max_p > 0 && search.try_fit(1, 0, None) {
        p = 1;
        q = 0;
    }
    if max_q > 0 && search.try_fit(0, 1, None) {
        p = 0;
        q = 1;
    }
    if search.intercept && search.try_fit(0, 0, Some(false)) {
        p = 0;
        q = 0;
    }

    let mut start_k = 0;
    while start_k < search.fits && search.fits < MAX_FITS {
        start_k = search.fits;
        // The seasonal moves of pmdarima's loop are no-ops for m = 1.
        let moves: [(isize, isize); 8] = [
            (-1, 0),
            (0, -1),
            (1, 0),
            (0, 1),
            (-1, -1),
            (-1, 1),
            (1, -1),
            (1, 1),
        ];
        let mut moved = false;
        for (dp, dq) in moves {
            let np = p as isize + dp;
            let nq = q as isize + dq;
            if np < 0 || nq < 0 || np as usize > max_p || nq as usize > max_q {
                continue;
            }
            if search.can_fit() && search.try_fit(np as usize, nq as usize, None) {
                p = np as usize;
                q = nq as usize;
                moved = true;
                break;
            }
        }
        if moved {
            continue;
        }
        let toggled = !search.intercept;
        if search.can_fit() && search.try_fit(p, q, Some(toggled)) {
            search.intercept = toggled;
        }
    }
    best_of(search.results)
}

/// pmdarima `_sort_and_filter_fits`: the finite-AIC fit with the lowest AIC (first on ties).
fn best_of(results: Vec<(ArimaSpec, Candidate)>) -> Result<FittedArima, ArimaError> {
    let mut best: Option<(f64, FittedArima)> = None;
    for (_, candidate) in results {
        let Some(fit) = candidate.fit else { continue };
        if !candidate.aic.is_finite() {
            continue;
        }
        if best.as_ref().is_none_or(|(aic, _)| candidate.aic < *aic) {
            best = Some((candidate.aic, fit));
        }
    }
    best.map(|(_, fit)| fit).ok_or(ArimaError::NoViableModel)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ndiffs_of_stationary_noise_is_zero() {
        let y: Vec<f64> = (0..200).map(|i| ((i * 7919) % 101) as f64 / 10.0).collect();
        assert_eq!(ndiffs(&y), 0);
    }

    #[test]
    fn ndiffs_of_trend_is_one() {
        let y: Vec<f64> = (0..100)
            .map(|i| f64::from(i) * 3.0 + ((i * 31) % 7) as f64)
            .collect();
        assert_eq!(ndiffs(&y), 1);
    }

    #[test]
    fn constant_detection() {
        assert!(is_constant(&[2.0, 2.0, 2.0]));
        assert!(!is_constant(&[2.0, 2.0, 2.5]));
    }
}
