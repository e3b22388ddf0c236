//! Multi-server queueing formulas for sizing a pool of engines that each serve one request at a
//! time from a shared first-come-first-served queue (Dynamo's prefill pool behind the router).
//!
//! - [`erlang_c`]: probability that an arrival waits in an M/M/c queue, `C(c, a)` with offered
//!   load `a = λ / μ` (Erlang B by its stable recursion, then `C = c B / (c − a (1 − B))`).
//! - [`Queue`]: a G/G/c queue described by its arrival rate, the mean and squared coefficient of
//!   variation (SCV) of the service time, and the SCV of inter-arrival times. Waiting times use
//!   the Allen–Cunneen approximation `Wq ≈ C(c, a) / (cμ − λ) · (ca² + cs²) / 2`, exact for
//!   M/M/c, and its tail `P(W > t) ≈ C(c, a) · exp(−(cμ − λ) t / k)` with `k = (ca² + cs²) / 2`
//!   (the M/M/c tail, `P(W > t) = C · exp(−(cμ − λ) t)`, stretched by the same factor).
//! - [`smallest_servers`]: the fewest servers for which the waiting time (mean, or a quantile)
//!   stays within a budget, in one pass over `c` (the Erlang B recursion is shared).
//!
//! All functions are total: unstable queues (`a ≥ c`) wait forever (`f64::INFINITY`), invalid
//! inputs (NaN, negative rates or times) are treated as no load.

/// Erlang B (blocking probability) for `c` servers and offered load `a`, by the recursion
/// `B(0) = 1, B(k) = a B(k−1) / (k + a B(k−1))`.
pub fn erlang_b(c: u32, a: f64) -> f64 {
    if a.is_nan() || a <= 0.0 {
        return if c == 0 { 1.0 } else { 0.0 };
    }
    let mut b = 1.0;
    for k in 1..=c {
        b = a * b / (f64::from(k) + a * b);
    }
    b
}

/// Erlang C: the probability that an arrival has to wait, for `c` servers and offered load `a`
/// (in Erlangs). 1 when the queue is unstable (`a ≥ c`), 0 without load.
pub fn erlang_c(c: u32, a: f64) -> f64 {
    erlang_c_from_b(c, a, erlang_b(c, a))
}

/// Erlang C from Erlang B of the same `c` and `a` (for scans over `c` that update B
/// incrementally).
pub fn erlang_c_from_b(c: u32, a: f64, b: f64) -> f64 {
    if a.is_nan() || a <= 0.0 {
        return 0.0;
    }
    let c = f64::from(c);
    if a >= c {
        return 1.0;
    }
    (c * b / (c - a * (1.0 - b))).clamp(0.0, 1.0)
}

/// A G/G/c queue (times in seconds).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Queue {
    /// Arrival rate (per second).
    pub arrival_rate: f64,
    /// Mean service time (s).
    pub mean_service_s: f64,
    /// Squared coefficient of variation of the service time (`Var[S] / E[S]²`; 1 for
    /// exponential, 0 for deterministic).
    pub service_scv: f64,
    /// Squared coefficient of variation of the inter-arrival times (1 for Poisson arrivals).
    pub arrival_scv: f64,
}

impl Queue {
    /// Offered load `a = λ E[S]` (Erlangs): the busy servers needed on average.
    pub fn offered_load(&self) -> f64 {
        let a = self.arrival_rate * self.mean_service_s;
        if a.is_finite() && a > 0.0 { a } else { 0.0 }
    }

    /// The Allen–Cunneen variability factor `(ca² + cs²) / 2`.
    pub fn variability(&self) -> f64 {
        let ca = if self.arrival_scv.is_finite() {
            self.arrival_scv.max(0.0)
        } else {
            1.0
        };
        let cs = if self.service_scv.is_finite() {
            self.service_scv.max(0.0)
        } else {
            1.0
        };
        (ca + cs) / 2.0
    }

    /// Probability of waiting with `c` servers.
    pub fn wait_probability(&self, c: u32) -> f64 {
        erlang_c(c, self.offered_load())
    }

    /// Mean waiting time in the queue (s) with `c` servers.
    pub fn mean_wait_s(&self, c: u32) -> f64 {
        let a = self.offered_load();
        self.mean_wait_given(c, a, erlang_c(c, a))
    }

    /// `P(W > t)` with `c` servers.
    pub fn wait_tail(&self, c: u32, t_s: f64) -> f64 {
        let a = self.offered_load();
        self.tail_given(c, a, erlang_c(c, a), t_s)
    }

    /// The `p`-quantile of the waiting time (s) with `c` servers, `p` in (0, 1): 0 when the
    /// probability of waiting is at most `1 − p`.
    pub fn wait_quantile_s(&self, c: u32, p: f64) -> f64 {
        let a = self.offered_load();
        self.quantile_given(c, a, erlang_c(c, a), p)
    }

    /// `(cμ − λ) / k`: the decay rate of the waiting-time tail (1/s); 0 when unstable.
    fn decay(&self, c: u32, a: f64) -> f64 {
        if self.mean_service_s.is_nan() || self.mean_service_s <= 0.0 {
            return f64::INFINITY;
        }
        let spare = (f64::from(c) - a) / self.mean_service_s;
        if spare > 0.0 {
            spare / self.variability().max(1e-9)
        } else {
            0.0
        }
    }

    /// Mean wait with `c` servers given `C(c, a)` (see [`erlang_c_from_b`]).
    pub fn mean_wait_given(&self, c: u32, a: f64, erlang: f64) -> f64 {
        if a <= 0.0 || erlang <= 0.0 {
            return 0.0;
        }
        let decay = self.decay(c, a);
        if decay <= 0.0 {
            f64::INFINITY
        } else {
            erlang / decay
        }
    }

    fn tail_given(&self, c: u32, a: f64, erlang: f64, t_s: f64) -> f64 {
        if a <= 0.0 || erlang <= 0.0 {
            return 0.0;
        }
        let decay = self.decay(c, a);
        if decay <= 0.0 {
            return 1.0;
        }
        erlang * (-decay * t_s.max(0.0)).exp()
    }

    /// Wait quantile with `c` servers given `C(c, a)`.
    pub fn quantile_given(&self, c: u32, a: f64, erlang: f64, p: f64) -> f64 {
        let p = if p.is_finite() {
            p.clamp(0.0, 1.0 - 1e-9)
        } else {
            0.5
        };
        let exceed = 1.0 - p;
        if a <= 0.0 || erlang <= exceed {
            return 0.0;
        }
        let decay = self.decay(c, a);
        if decay <= 0.0 {
            return f64::INFINITY;
        }
        (erlang / exceed).ln() / decay
    }
}

/// What the waiting time is held to.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum WaitTarget {
    /// The mean waiting time.
    Mean,
    /// The `p`-quantile of the waiting time, `p` in (0, 1).
    Quantile(f64),
}

/// The fewest servers in `[min, max]` for which the waiting time (per `target`) is at most
/// `budget_s`, with that waiting time; `None` when even `max` does not meet the budget.
pub fn smallest_servers(
    queue: &Queue,
    target: WaitTarget,
    budget_s: f64,
    min: u32,
    max: u32,
) -> Option<(u32, f64)> {
    let a = queue.offered_load();
    let budget = if budget_s.is_finite() {
        budget_s.max(0.0)
    } else {
        0.0
    };
    if a <= 0.0 {
        return (min <= max).then_some((min, 0.0));
    }
    // Erlang B up to `max`, testing each `c` from `min` on (stable queues only).
    let mut b = 1.0;
    for c in 1..=max {
        b = a * b / (f64::from(c) + a * b);
        if c < min || f64::from(c) <= a {
            continue;
        }
        let erlang = erlang_c_from_b(c, a, b);
        let wait = match target {
            WaitTarget::Mean => queue.mean_wait_given(c, a, erlang),
            WaitTarget::Quantile(p) => queue.quantile_given(c, a, erlang, p),
        };
        if wait <= budget {
            return Some((c, wait));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    #![allow(clippy::float_cmp)]
    use super::*;

    fn close(a: f64, b: f64, tol: f64) -> bool {
        (a - b).abs() <= tol * b.abs().max(1e-12)
    }

    fn mm(c_lambda: f64, mu: f64) -> Queue {
        Queue {
            arrival_rate: c_lambda,
            mean_service_s: 1.0 / mu,
            service_scv: 1.0,
            arrival_scv: 1.0,
        }
    }

    #[test]
    fn erlang_c_matches_tables() {
        // M/M/1: C = ρ.
        assert!(close(erlang_c(1, 0.5), 0.5, 1e-12));
        assert!(close(erlang_c(1, 0.9), 0.9, 1e-12));
        // M/M/2 at a = 1: C = a² / (2 + a) ... = 1/3.
        assert!(close(erlang_c(2, 1.0), 1.0 / 3.0, 1e-12));
        // Textbook values.
        assert!(close(erlang_c(3, 2.0), 4.0 / 9.0, 1e-12));
        assert!(close(erlang_c(5, 3.0), 0.236_151_603, 1e-8));
        assert!(close(erlang_c(10, 8.0), 0.409_180_150_8, 1e-8));
        // Unstable and empty.
        assert_eq!(erlang_c(2, 2.0), 1.0);
        assert_eq!(erlang_c(2, 3.0), 1.0);
        assert_eq!(erlang_c(2, 0.0), 0.0);
        assert_eq!(erlang_c(2, f64::NAN), 0.0);
        // Erlang B: B(1, a) = a / (1 + a).
        assert!(close(erlang_b(1, 3.0), 0.75, 1e-12));
    }

    #[test]
    fn mm1_mean_wait_is_rho_over_mu_minus_lambda() {
        for (lambda, mu) in [(0.5, 1.0), (3.0, 4.0), (9.0, 10.0)] {
            let q = mm(lambda, mu);
            let rho = lambda / mu;
            assert!(
                close(q.mean_wait_s(1), rho / (mu - lambda), 1e-12),
                "{lambda} {mu}"
            );
            // P(W > t) = ρ exp(−(μ − λ) t).
            assert!(close(
                q.wait_tail(1, 2.0),
                rho * (-(mu - lambda) * 2.0).exp(),
                1e-12
            ));
        }
    }

    #[test]
    fn mm2_known_values() {
        // λ = 1, μ = 1, c = 2: C = 1/3, Wq = C / (2 − 1) = 1/3.
        let q = mm(1.0, 1.0);
        assert!(close(q.mean_wait_s(2), 1.0 / 3.0, 1e-12));
        // λ = 1.5, μ = 1: C = 9/14, Wq = (9/14) / 0.5 = 9/7.
        let q = mm(1.5, 1.0);
        assert!(close(q.wait_probability(2), 9.0 / 14.0, 1e-12));
        assert!(close(q.mean_wait_s(2), 9.0 / 7.0, 1e-12));
        // Unstable: infinite wait.
        assert_eq!(mm(2.0, 1.0).mean_wait_s(2), f64::INFINITY);
    }

    #[test]
    fn allen_cunneen_scales_the_mm_c_wait() {
        // M/D/1: Wq = ρ / (2 μ (1 − ρ)), half the M/M/1 value (exact for one server).
        let q = Queue {
            arrival_rate: 0.5,
            mean_service_s: 1.0,
            service_scv: 0.0,
            arrival_scv: 1.0,
        };
        assert!(close(q.mean_wait_s(1), 0.5, 1e-12));
        // Pollaczek–Khinchine for M/G/1 with cs² = 3: Wq = ρ (1 + cs²) / (2 (μ − λ)) · ... = 2 × M/M/1.
        let q = Queue {
            service_scv: 3.0,
            ..q
        };
        assert!(close(q.mean_wait_s(1), 2.0, 1e-12));
    }

    #[test]
    fn quantiles_invert_the_tail() {
        let q = mm(7.0, 1.0);
        let c = 9;
        let t = q.wait_quantile_s(c, 0.95);
        assert!(t > 0.0);
        assert!(close(q.wait_tail(c, t), 0.05, 1e-9));
        // Waiting is rarer than 1 − p: the quantile is 0.
        assert_eq!(mm(1.0, 1.0).wait_quantile_s(10, 0.9), 0.0);
    }

    #[test]
    fn smallest_servers_scans_up_to_the_budget() {
        // a = 8: 9 servers are the first stable count.
        let q = mm(8.0, 1.0);
        let (c, wait) = smallest_servers(&q, WaitTarget::Mean, 0.1, 1, 64).unwrap_or((0, 0.0));
        assert!(c > 8);
        assert!(wait <= 0.1);
        assert!(q.mean_wait_s(c - 1) > 0.1);
        assert!(close(wait, q.mean_wait_s(c), 1e-12));
        // A quantile target needs at least as many servers as the mean.
        let (cq, _) = smallest_servers(&q, WaitTarget::Quantile(0.95), 0.1, 1, 64).unwrap_or((0, 0.0));
        assert!(cq >= c);
        // The minimum applies, the maximum bounds the search.
        assert_eq!(
            smallest_servers(&q, WaitTarget::Mean, 10.0, 20, 64).map(|r| r.0),
            Some(20)
        );
        assert_eq!(smallest_servers(&q, WaitTarget::Mean, 0.1, 1, 8), None);
        // No load: the minimum.
        assert_eq!(
            smallest_servers(&mm(0.0, 1.0), WaitTarget::Mean, 0.0, 2, 64),
            Some((2, 0.0))
        );
    }
}
