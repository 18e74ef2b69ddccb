//! The metrics recorder stays bounded with nobody scraping `/metrics`.
//!
//! The Prometheus exporter keeps every histogram sample raw until something folds them into
//! buckets; without its upkeep timer only a scrape did, so an unscraped daemon grew by 8 to 16
//! bytes per transaction forever. This binary counts live heap bytes with its own global
//! allocator (so it holds this one test only) and records a million commit-to-ack samples through
//! the installed recorder without rendering once.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        unsafe { System.dealloc(p, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

#[test]
fn a_million_histogram_samples_without_a_scrape_stay_bounded() {
    const BATCH: usize = 100_000;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let upkeep = Duration::from_millis(10);
        let _handle = outboxd::metrics::install_recorder(upkeep).expect("recorder installs");
        let m = outboxd::metrics::Metrics::new();
        let record = || {
            for i in 0..BATCH {
                m.commit_to_ack.record((i % 1000) as f64 / 1000.0);
            }
        };
        // Warm up: the histogram's buckets and the recorder's registry exist from here on.
        record();
        tokio::time::sleep(upkeep * 10).await;
        let base = LIVE.load(Ordering::Relaxed);
        for _ in 0..10 {
            record();
            // Time for the upkeep to run, as the daemon's loop would give it between events.
            tokio::time::sleep(upkeep * 5).await;
        }
        let grown = LIVE.load(Ordering::Relaxed).saturating_sub(base);
        eprintln!("live heap grew by {grown} bytes over {} samples", BATCH * 10);
        assert!(grown < 1 << 20, "live heap grew by {grown} bytes over {} unscraped samples", BATCH * 10);
    });
}
