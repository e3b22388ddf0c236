//! The constant predictor: the next interval looks like the last one.

use super::{Fallback, Forecast};

/// The last value, or 0 with [`Fallback::TooFewPoints`] when nothing has been observed.
pub(super) fn predict(history: &[f64]) -> Forecast {
    match history.last() {
        Some(last) => Forecast::model(*last),
        None => Forecast::fallback(0.0, Fallback::TooFewPoints { have: 0, need: 1 }),
    }
}
