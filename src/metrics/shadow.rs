//! The gauges `outboxd shadow --follow` exports (`outboxd_shadow_*`, described in
//! [`super::catalog`]): one handle each, made once after the recorder is installed (a handle made
//! before it would record nowhere), and set together from one [`ShadowFigures`] snapshot, so a
//! scrape sees the figures of one moment. The tool decides the figures; this module only
//! exports them.

use metrics::{gauge, Gauge};

/// What the tool has counted so far; index 0 is the legacy side, 1 the shadow side.
#[derive(Clone, Copy, Debug, Default)]
pub struct ShadowFigures {
    pub matched: u64,
    pub different: u64,
    pub only: [u64; 2],
    pub pending: [usize; 2],
    pub duplicates: [u64; 2],
    pub unidentified: [u64; 2],
    /// Median and largest shadow-minus-legacy lag, in milliseconds; `None` before a pair.
    pub lag_ms: Option<(i64, i64)>,
}

/// The `--follow` gauges.
pub struct ShadowMetrics {
    matched: Gauge,
    different: Gauge,
    only: [Gauge; 2],
    pending: [Gauge; 2],
    duplicates: [Gauge; 2],
    unidentified: [Gauge; 2],
    lag_p50: Gauge,
    lag_max: Gauge,
}

impl ShadowMetrics {
    /// `sides` are the `side` label's values, legacy first.
    pub fn new(sides: [&'static str; 2]) -> ShadowMetrics {
        let per_side = |name: &'static str| sides.map(|s| gauge!(name, "side" => s));
        ShadowMetrics {
            matched: gauge!("outboxd_shadow_matched"),
            different: gauge!("outboxd_shadow_different"),
            only: [gauge!("outboxd_shadow_only_legacy"), gauge!("outboxd_shadow_only_shadow")],
            pending: per_side("outboxd_shadow_pending"),
            duplicates: per_side("outboxd_shadow_duplicates"),
            unidentified: per_side("outboxd_shadow_unidentified"),
            lag_p50: gauge!("outboxd_shadow_lag_p50_seconds"),
            lag_max: gauge!("outboxd_shadow_lag_max_seconds"),
        }
    }

    /// Every gauge from `f`; the lag gauges keep their last value until a pair is seen.
    pub fn set(&self, f: &ShadowFigures) {
        self.matched.set(f.matched as f64);
        self.different.set(f.different as f64);
        for i in 0..2 {
            self.only[i].set(f.only[i] as f64);
            self.pending[i].set(f.pending[i] as f64);
            self.duplicates[i].set(f.duplicates[i] as f64);
            self.unidentified[i].set(f.unidentified[i] as f64);
        }
        if let Some((p50, max)) = f.lag_ms {
            self.lag_p50.set(p50 as f64 / 1000.0);
            self.lag_max.set(max as f64 / 1000.0);
        }
    }
}
