//! The statistics the stages share: quantiles of short windows, bounded histories and relative
//! errors. Nothing here knows about pools or requests.

use std::collections::VecDeque;

/// The `q`-quantile (0..1) of `values` (linear between order statistics); `None` when empty.
pub(super) fn quantile(values: impl Iterator<Item = f64>, q: f64) -> Option<f64> {
    // The windows are short (tens of values): a stack buffer spares an allocation per call.
    let mut stack = [0.0; 64];
    let mut heap = Vec::new();
    let mut len = 0;
    for value in values.filter(|v| v.is_finite()) {
        if len < stack.len() {
            stack[len] = value;
        } else {
            if heap.is_empty() {
                heap.extend_from_slice(&stack);
            }
            heap.push(value);
        }
        len += 1;
    }
    let values = if heap.is_empty() {
        &mut stack[..len]
    } else {
        &mut heap[..]
    };
    if values.is_empty() {
        return None;
    }
    let position = q.clamp(0.0, 1.0) * (values.len() - 1) as f64;
    let below = (position.floor() as usize).min(values.len() - 1);
    let weight = position - below as f64;
    // Two order statistics, found by selection rather than a full sort (this runs several
    // times per interval for every policy).
    let (_, lower, rest) = values.select_nth_unstable_by(below, f64::total_cmp);
    let lower = *lower;
    let upper = rest.iter().copied().min_by(f64::total_cmp).unwrap_or(lower);
    Some(lower * (1.0 - weight) + upper * weight)
}

/// The median of `values`; `None` when empty.
pub(super) fn median(values: impl Iterator<Item = f64>) -> Option<f64> {
    quantile(values, 0.5)
}

/// Appends `value`, dropping the oldest beyond `keep` (at least one is kept).
pub(super) fn push_bounded(queue: &mut VecDeque<f64>, value: f64, keep: usize) {
    queue.push_back(value);
    while queue.len() > keep.max(1) {
        queue.pop_front();
    }
}

/// `ln((actual + unit) / (forecast + unit))`: the relative error, with `unit` keeping small
/// counts from dominating.
pub(super) fn log_error(actual: f64, forecast: f64, unit: f64) -> f64 {
    ((actual.max(0.0) + unit) / (forecast.max(0.0) + unit)).ln()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_interpolate_between_order_statistics_of_finite_values() {
        let sorted_quantile = |values: &[f64], q: f64| {
            let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
            v.sort_by(f64::total_cmp);
            let position = q * (v.len() - 1) as f64;
            let below = position.floor() as usize;
            let above = (below + 1).min(v.len() - 1);
            v[below] + (v[above] - v[below]) * (position - below as f64)
        };
        assert_eq!(quantile(std::iter::empty(), 0.5), None);
        assert_eq!(quantile([f64::NAN, f64::INFINITY].into_iter(), 0.5), None);
        assert_eq!(quantile([1.0, 3.0].into_iter(), 0.5), Some(2.0));
        assert_eq!(median([1.0, 3.0, 9.0].into_iter()), Some(3.0));
        assert_eq!(quantile([5.0, f64::NAN, 1.0, 3.0].into_iter(), 1.0), Some(5.0));
        // Past the stack buffer's 64 values too.
        for n in [1_usize, 20, 63, 64, 65, 200] {
            let values: Vec<f64> = (0..n).map(|i| ((i * 7919) % 101) as f64 - 50.0).collect();
            for q in [0.0, 0.1, 0.5, 0.7, 0.95, 1.0] {
                let got = quantile(values.iter().copied(), q).unwrap();
                assert!(
                    (got - sorted_quantile(&values, q)).abs() < 1e-9,
                    "n {n} q {q}: {got}"
                );
            }
        }
    }

    #[test]
    fn histories_keep_the_newest_and_errors_are_relative() {
        let mut kept = VecDeque::new();
        for v in 0..5 {
            push_bounded(&mut kept, f64::from(v), 3);
        }
        assert_eq!(kept, [2.0, 3.0, 4.0]);
        push_bounded(&mut kept, 9.0, 0);
        assert_eq!(kept, [9.0]);
        assert_eq!(log_error(10.0, 10.0, 1.0), 0.0);
        assert!((log_error(19.0, 9.0, 1.0) - 2.0_f64.ln()).abs() < 1e-12);
        // Negative inputs count as none.
        assert_eq!(log_error(-5.0, 0.0, 1.0), 0.0);
    }
}
