//! Fuzz `Decoder::decode`, the pgoutput message decoder.
//!
//! The first input byte picks the decoder's set-up, the rest is the message:
//! * bits 0–1: protocol version 1–4 (4 adds abort LSN/time to Stream Abort);
//! * bit 2: start inside a streamed block (a valid Stream Start is decoded first), so Relation,
//!   Type, Insert, Update, Delete, Truncate and Message expect the extra xid;
//! * bit 3: the rest is a sequence of messages, each prefixed by a big-endian u16 length, all fed
//!   to one decoder, so state changes (Stream Start/Stop) carry from one message to the next.
//!
//! Besides "never panics", every decode checks the decoder's contract: state changes only on a
//! successfully decoded Stream Start/Stop, and a message that decodes gets `TrailingBytes(1)` when
//! one byte is appended.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use outboxd::pg::pgoutput::{DecodeError, Decoder, LogicalMessage};

/// A decoder in the given state, reached the way the server gets it there.
fn decoder(proto: u32, in_stream: bool) -> Decoder {
    let mut d = Decoder::new(proto);
    if in_stream {
        d.decode(Bytes::from_static(b"S\x00\x00\x00\x07\x01")).expect("valid Stream Start");
    }
    d
}

fn check_one(d: &mut Decoder, msg: &[u8]) {
    let before = d.in_stream();
    match d.decode(Bytes::copy_from_slice(msg)) {
        Ok(m) => {
            let want = match m {
                LogicalMessage::StreamStart(_) => true,
                LogicalMessage::StreamStop => false,
                _ => before,
            };
            assert_eq!(d.in_stream(), want, "state after {m:?}");
            let mut longer = msg.to_vec();
            longer.push(0);
            let mut again = decoder(d.proto_version(), before);
            let err = again.decode(longer.into());
            assert!(matches!(err, Err(DecodeError::TrailingBytes(1))), "{msg:?} + one byte gave {err:?}");
            assert_eq!(again.in_stream(), before, "failed decode changed state");
        }
        Err(e) => {
            assert_eq!(d.in_stream(), before, "failed decode ({e}) changed state");
            // Error messages are printed to operators; formatting must not panic either.
            let _ = e.to_string();
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let mut d = decoder(1 + u32::from(mode & 0b11), mode & 0b100 != 0);
    if mode & 0b1000 == 0 {
        check_one(&mut d, rest);
        return;
    }
    let mut rest = rest;
    while rest.len() >= 2 {
        let len = usize::from(u16::from_be_bytes([rest[0], rest[1]])).min(rest.len() - 2);
        check_one(&mut d, &rest[2..2 + len]);
        rest = &rest[2 + len..];
    }
});
