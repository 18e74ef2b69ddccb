//! Fuzz `parse_copy_data`, the XLogData / Primary keepalive framing parser, and feed every XLogData
//! payload it accepts on into a protocol-1 pgoutput decoder, as the pipeline does.
//!
//! Besides "never panics", an accepted frame must be exactly what the spec allows: `w` + 24 header
//! bytes + payload (the payload is the rest, byte for byte), or `k` + exactly 17 bytes; and every
//! such frame must be accepted.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use outboxd::lsn::Lsn;
use outboxd::pg::pgoutput::Decoder;
use outboxd::pg::replication::{parse_copy_data, WalMessage};

fn be64(b: &[u8]) -> u64 {
    u64::from_be_bytes(b[..8].try_into().unwrap())
}

fuzz_target!(|data: &[u8]| {
    let valid_shape = match data.first() {
        Some(b'w') => data.len() >= 25,
        Some(b'k') => data.len() == 18,
        _ => false,
    };
    match parse_copy_data(Bytes::copy_from_slice(data)) {
        Ok(WalMessage::Data { wal_start, wal_end, data: payload }) => {
            assert!(valid_shape && data[0] == b'w', "accepted {data:?} as XLogData");
            assert_eq!(wal_start, Lsn(be64(&data[1..])));
            assert_eq!(wal_end, Lsn(be64(&data[9..])));
            assert_eq!(&payload[..], &data[25..]);
            let _ = Decoder::new(1).decode(payload);
        }
        Ok(WalMessage::Keepalive { wal_end, reply_requested }) => {
            assert!(valid_shape && data[0] == b'k', "accepted {data:?} as keepalive");
            assert_eq!(wal_end, Lsn(be64(&data[1..])));
            assert_eq!(reply_requested, data[17] == 1);
        }
        Err(e) => {
            assert!(!valid_shape, "rejected a well-formed frame {data:?}: {e}");
        }
    }
});
