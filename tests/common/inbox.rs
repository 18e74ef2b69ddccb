//! Helpers of the `outboxd inbox` tests: numbered records as a producer service would send them,
//! and the rows the inbox holds.

use std::ops::Range;
use std::time::Duration;

use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

use super::kafka::Broker;
use super::postgres::PgCluster;

/// Records `ids` into `topic` through the harness's own listener, then flushed: header `id` =
/// `e{i}`, key `key(i)`, payload `{"i": i}`, and the Kafka timestamp `stamp_ms` when given.
pub fn produce_numbered(
    broker: &Broker,
    topic: &str,
    ids: Range<usize>,
    key: impl Fn(usize) -> String,
    stamp_ms: Option<i64>,
) {
    let producer: BaseProducer = broker.client_config().create().expect("producer");
    for i in ids {
        let (id, key) = (format!("e{i}"), key(i));
        let payload = serde_json::json!({ "i": i }).to_string();
        let headers = OwnedHeaders::new().insert(Header { key: "id", value: Some(id.as_str()) });
        let mut rec = BaseRecord::to(topic).key(&key).payload(&payload).headers(headers);
        if let Some(ts) = stamp_ms {
            rec = rec.timestamp(ts);
        }
        while let Err((_, r)) = producer.send(rec) {
            producer.poll(Duration::from_millis(10));
            rec = r;
        }
        producer.poll(Duration::ZERO);
    }
    producer.flush(Duration::from_secs(30)).expect("flush");
}

/// Rows in `public.inbox`; 0 before the inbox has made the table.
pub fn inbox_rows(pg: &PgCluster) -> usize {
    if pg.psql("SELECT to_regclass('public.inbox') IS NULL").trim() == "t" {
        return 0;
    }
    pg.psql("SELECT count(*) FROM public.inbox").trim().parse().unwrap_or(0)
}
