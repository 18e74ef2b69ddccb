-- bench_fill(rows, per_txn, type_prefix): the benchmarks' outbox rows, `per_txn` rows per
-- transaction. Each row: ~300 B of jsonb, aggregate i % 1000, event type i % 5 (with
-- `type_prefix` before it), the same shape examples/bench_insert.rs writes. One definition for
-- bench/run's driver, bench/profile.sh and bench/ab.sh, so their backlogs stay comparable.
-- A procedure, so it can commit between batches: CALL it outside a transaction block.
CREATE OR REPLACE PROCEDURE bench_fill(rows bigint, per_txn bigint, type_prefix text DEFAULT '')
LANGUAGE plpgsql AS $$
DECLARE b bigint;
BEGIN
  FOR b IN 0..((rows + per_txn - 1) / per_txn - 1) LOOP
    INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
    SELECT 'order', (i % 1000)::text,
           type_prefix || (ARRAY['order.created.v1','order.paid.v1','order.shipped.v1','order.delivered.v1','order.cancelled.v1'])[1 + i % 5],
           jsonb_build_object(
             'orderId', i, 'customerId', 'cust-' || lpad((i % 5000)::text, 5, '0'), 'status', 'PAID',
             'currency', 'EUR', 'total', (10 + i % 490) + (i % 100) / 100.0,
             'items', jsonb_build_array(
               jsonb_build_object('sku', 'SKU-' || lpad((i % 317)::text, 4, '0'), 'qty', 1 + i % 3, 'price', 12.5),
               jsonb_build_object('sku', 'SKU-' || lpad((i % 211)::text, 4, '0'), 'qty', 1, 'price', 7.25)),
             'shipTo', jsonb_build_object('street', (1 + i % 999) || ' Benchmark Street', 'city', 'Amsterdam',
                                          'country', 'NL'))
    FROM generate_series(b * per_txn + 1, least((b + 1) * per_txn, rows)) AS i;
    COMMIT;
  END LOOP;
END $$;
