//! The local AWS API the AWS sinks' tests run against: what tools/aws/moto_server.py changes in
//! moto must not make it answer what AWS would not. Its `attributes` shortcut while a message is
//! stored answers ContentBasedDeduplication for FIFO queues only, as moto's own does: a standard
//! queue with the attribute set gets no content-based deduplication ids (AWS gives it none), a
//! FIFO queue with it still does.

mod common;

use common::aws::Moto;

#[test]
fn content_based_deduplication_ids_only_on_a_fifo_queue() {
    let moto = Moto::start();
    let standard = moto.client(&["create-queue", "plain", "ContentBasedDeduplication=true"]).trim().to_owned();
    let fifo = moto.client(&["create-queue", "cbd.fifo", "fifo", "ContentBasedDeduplication=true"]).trim().to_owned();
    moto.client(&["send-message", &standard, "one"]);
    moto.client(&["send-message", &fifo, "one", "g"]);
    let got = moto.drain_queue(&standard, 1);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].dedup, None, "a standard queue's message has no deduplication id: {got:?}");
    let got = moto.drain_queue(&fifo, 1);
    assert_eq!(got.len(), 1, "{got:?}");
    assert!(got[0].dedup.as_deref().is_some_and(|d| d.len() == 64), "the body's SHA-256 on a FIFO queue: {got:?}");
}
