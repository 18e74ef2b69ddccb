//! Micro-benchmark for `bench/mask`: what `--mask`/`--encrypt` cost per event, in process.
//!
//! The records look like the ones `bench/run` drains: ~300 B of jsonb text (as PostgreSQL prints
//! it, `", "` and `": "` separators), one `id` header. Each scenario masks the same `N` records
//! (cloned from 1,000 templates: the clone is in every scenario, the baseline included) `REPS`
//! times; per scenario it prints the median, min and max ns per event, and the median minus the
//! baseline's (the rules' own cost).
//!
//! Usage: `bench_mask [N] [REPS]` (defaults 200000 and 7). Prints one line per scenario:
//! `scenario=NAME ns_median=X ns_min=Y ns_max=Z added_ns=W`.

use std::time::Instant;

use bytes::Bytes;
use outboxd::router::mask::{MaskSpec, Masking};
use outboxd::router::Record;

/// Event `i`'s payload, as `bench/run` inserts it and jsonb prints it back.
fn payload(i: u64) -> String {
    format!(
        concat!(
            r#"{{"total": {t}.{tc:02}, "items": [{{"qty": {q}, "sku": "SKU-{s1:04}", "price": 12.5}}, "#,
            r#"{{"qty": 1, "sku": "SKU-{s2:04}", "price": 7.25}}], "shipTo": {{"city": "Amsterdam", "street": "{n} Benchmark Street", "country": "NL"}}, "#,
            r#""status": "PAID", "orderId": {i}, "currency": "EUR", "customerId": "cust-{c:05}"}}"#
        ),
        i = i,
        c = i % 5000,
        t = 10 + i % 490,
        tc = i % 100,
        s1 = i % 317,
        q = 1 + i % 3,
        s2 = i % 211,
        n = 1 + i % 999,
    )
}

fn record(i: u64) -> Record {
    Record {
        topic: "order.paid.v1.events".into(),
        key: Some(Bytes::from(format!("agg-{}", i % 1000))),
        payload: Some(Bytes::from(payload(i))),
        headers: vec![("id".into(), Bytes::from(format!("0b6b3c1e-0000-4000-8000-{i:012}")))],
        partition: None,
        timestamp_ms: Some(1_796_000_000_000),
        event_id: format!("0b6b3c1e-0000-4000-8000-{i:012}").into(),
        event_type: None,
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn main() {
    let mut argv = std::env::args().skip(1);
    let n: u64 = argv.next().and_then(|s| s.parse().ok()).unwrap_or(200_000);
    let reps: usize = argv.next().and_then(|s| s.parse().ok()).unwrap_or(7);
    let dir = tempfile::tempdir().expect("tempdir");
    let hash_key = dir.path().join("hash.key");
    std::fs::write(&hash_key, "bench-hmac-key-0123456789abcdef\n").unwrap();
    let ring = dir.path().join("ring.json");
    std::fs::write(&ring, r#"{"keys":[{"kid":"k1","key":"AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8="}]}"#).unwrap();
    let spec = |masks: &[&str], encrypt: &[&str], event_type: Option<&str>| MaskSpec {
        masks: masks.iter().map(|s| s.to_string()).collect(),
        encrypt: encrypt.iter().map(|s| s.to_string()).collect(),
        mask_key_file: Some(hash_key.clone()),
        encrypt_key_file: Some(ring.clone()),
        event_type: event_type.map(String::from),
    };
    let two = ["/customerId=hash", "/shipTo/street=redact"];
    let scenarios: Vec<(&str, MaskSpec)> = vec![
        ("no-rules", MaskSpec::default()),
        ("other-event-type", spec(&two, &[], Some(r"user\..*"))),
        ("rules-match-nothing", spec(&["/card/number=last4", "/customer/email=hash"], &[], None)),
        ("two-masks", spec(&two, &[], None)),
        ("two-masks+array", spec(&["/customerId=hash", "/shipTo/street=redact", "/items/*/sku=last4"], &[], None)),
        ("two-masks+encrypt", spec(&two, &["/shipTo/city"], None)),
    ];
    let templates: Vec<Record> = (0..1000).map(record).collect();
    let mut baseline = None;
    for (name, s) in scenarios {
        let m = Masking::compile(s, false).expect("rules compile");
        let mut per_event = Vec::with_capacity(reps);
        let mut sink = 0usize;
        for _ in 0..reps {
            let t0 = Instant::now();
            for i in 0..n {
                let r = templates[(i % 1000) as usize].clone();
                let out = m.apply(r, Some("order.paid.v1")).expect("maskable");
                sink = sink.wrapping_add(out.payload.as_ref().map_or(0, |p| p.len()));
            }
            per_event.push(t0.elapsed().as_nanos() as f64 / n as f64);
        }
        let (min, max) = per_event.iter().fold((f64::MAX, 0f64), |(lo, hi), &x| (lo.min(x), hi.max(x)));
        let med = median(&mut per_event);
        let base = *baseline.get_or_insert(med);
        println!(
            "scenario={name} ns_median={med:.0} ns_min={min:.0} ns_max={max:.0} added_ns={:.0} bytes_out={}",
            med - base,
            sink / reps / n as usize
        );
    }
}
