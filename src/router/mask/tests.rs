//! Table-driven tests of the rules: payloads and headers in, exact bytes out.

use std::path::PathBuf;

use bytes::Bytes;

use super::*;

/// RFC 4231 test case 1: key 0x0b × 20, "Hi There".
const RFC4231_KEY: [u8; 20] = [0x0b; 20];
const RFC4231_HI_THERE: &str = "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7";

struct Keys {
    dir: tempfile::TempDir,
}

impl Keys {
    fn new() -> Keys {
        let k = Keys { dir: tempfile::tempdir().unwrap() };
        // A trailing newline, as `echo` or an editor leaves it, is not part of the key.
        let mut hash = RFC4231_KEY.to_vec();
        hash.push(b'\n');
        std::fs::write(k.path("hash.key"), hash).unwrap();
        k
    }
    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
    /// A keyring file of these (kid, key byte) pairs, each key 32 copies of its byte.
    fn ring(&self, name: &str, keys: &[(&str, u8)]) -> PathBuf {
        use base64::Engine as _;
        let keys: Vec<serde_json::Value> = keys
            .iter()
            .map(|(kid, b)| serde_json::json!({"kid": kid, "key": base64::engine::general_purpose::STANDARD.encode([*b; 32])}))
            .collect();
        let p = self.path(name);
        std::fs::write(&p, serde_json::json!({ "keys": keys }).to_string()).unwrap();
        p
    }
}

fn spec(masks: &[&str], keys: &Keys) -> MaskSpec {
    MaskSpec {
        masks: masks.iter().map(|s| s.to_string()).collect(),
        mask_key_file: Some(keys.path("hash.key")),
        ..MaskSpec::default()
    }
}

fn record(payload: &str, headers: &[(&str, &str)]) -> Record {
    let mut headers: Vec<(&str, &str)> = headers.to_vec();
    if !headers.iter().any(|(k, _)| *k == "id") {
        // As the router puts it first: the event id.
        headers.insert(0, ("id", "e-1"));
    }
    Record {
        topic: "order.paid.v1.events".into(),
        key: Some(Bytes::from_static(b"42")),
        payload: Some(Bytes::copy_from_slice(payload.as_bytes())),
        headers: headers.iter().map(|(k, v)| (k.to_string().into(), Bytes::copy_from_slice(v.as_bytes()))).collect(),
        partition: None,
        timestamp_ms: Some(1),
        event_id: "e-1".into(),
        event_type: None,
    }
}

fn text(b: &Option<Bytes>) -> &str {
    std::str::from_utf8(b.as_deref().unwrap()).unwrap()
}

#[test]
fn payload_rules() {
    let keys = Keys::new();
    let hi = RFC4231_HI_THERE;
    // (rules, payload in, payload out: Some(exact text), or None for an unmaskable payload)
    let cases: &[(&[&str], &str, Option<&str>)] = &[
        // Only containers on the path are rebuilt (compact); the rest keeps its bytes: 10.50 stays.
        (
            &["/card/number=last4"],
            r#"{"card": {"number": "4111111111111111", "exp": "12/30"}, "total": 10.50, "x": [1, 2]}"#,
            Some(r#"{"card":{"number":"************1111","exp":"12/30"},"total":10.50,"x":[1, 2]}"#),
        ),
        // `*` over an array; elements without the field are left alone.
        (
            &["/items/*/card=redact"],
            r#"{"items":[{"card":"1","q":1},{"q":2},{"card":{"n":3}}]}"#,
            Some(r#"{"items":[{"card":"***","q":1},{"q":2},{"card":"***"}]}"#),
        ),
        (&["/items/*=drop"], r#"{"items":[1,2,3],"k":0}"#, Some(r#"{"items":[],"k":0}"#)),
        (&["/items/1=drop"], r#"{"items":[1,2,3]}"#, Some(r#"{"items":[1,3]}"#)),
        (&["/items/01=drop"], r#"{"items":[1,2,3]}"#, Some(r#"{"items":[1,2,3]}"#)),
        // `*` over object members too.
        (
            &["/cards/*/cvv=drop"],
            r#"{"cards":{"a":{"cvv":1,"n":2},"b":{"cvv":3}}}"#,
            Some(r#"{"cards":{"a":{"n":2},"b":{}}}"#),
        ),
        // Missing fields, and paths through scalars, change nothing.
        (&["/customer/email=redact"], r#"{"total": 1}"#, Some(r#"{"total": 1}"#)),
        (&["/total/x=redact"], r#"{"total": 1}"#, Some(r#"{"total": 1}"#)),
        (&["/items/9=redact"], r#"[0]"#, Some(r#"[0]"#)),
        // Nested, dropping the only member, key order kept.
        (&["/a/b/c=drop"], r#"{"z":0,"a":{"b":{"c":1}}}"#, Some(r#"{"z":0,"a":{"b":{}}}"#)),
        (&["/a~1b=redact", "/t~0=redact"], r#"{"a/b":"x","t~":"y"}"#, Some(r#"{"a/b":"***","t~":"***"}"#)),
        // hash: a string's text, any other value's compact JSON text.
        (&["/n=hash"], r#"{"n":"Hi There"}"#, Some(&*format!(r#"{{"n":"{hi}"}}"#))),
        // Two rules on one field apply in order; rules below a node before the node's own.
        (&["/c/n=last4", "/c=hash"], r#"{"c":{"n":"12345"}}"#, Some(r#"{"c":"HASH"}"#)),
        // Payloads rules cannot look into.
        (&["/a=redact"], "not json", None),
        (&["/a=redact"], r#""a JSON string""#, None),
        (&["/a=redact"], "17", None),
        (&["/a=redact"], r#"{"a":1"#, None),
        (&["/a=redact"], "null", Some("null")),
    ];
    for (rules, input, want) in cases {
        let m = Masking::compile(spec(rules, &keys), false).unwrap();
        let got = m.apply(record(input, &[]), None);
        match (want, got) {
            (Some(w), Ok(r)) if w.contains("HASH") => {
                let h = m.hash_key.as_ref().unwrap().hex(r#"{"n":"*2345"}"#);
                assert_eq!(text(&r.payload), w.replace("HASH", &h), "{rules:?} on {input}");
            }
            (Some(w), Ok(r)) => assert_eq!(text(&r.payload), *w, "{rules:?} on {input}"),
            (None, Err(bad)) => {
                assert_eq!(bad.code, UNMASKABLE, "{rules:?} on {input}");
                assert_eq!(bad.payload, None, "an unmaskable payload never reaches the DLQ copy");
                assert!(bad.payload_dropped.as_deref().unwrap().contains("payload"), "{:?}", bad.payload_dropped);
                assert!(!bad.message.contains(input), "the reason must not echo the payload: {}", bad.message);
            }
            (w, g) => panic!("{rules:?} on {input}: want {w:?}, got {g:?}"),
        }
    }
}

#[test]
fn unmatched_events_keep_their_bytes() {
    let keys = Keys::new();
    let input = r#"{ "total" : 1.0 , "card": "4111111111111111" }"#;
    let mut s = spec(&["/customer=redact", "headers/email=drop"], &keys);
    // A rule that finds nothing: the original Bytes, not a re-serialization.
    let m = Masking::compile(s.clone(), false).unwrap();
    let r = record(input, &[("trace", "t")]);
    let before = r.payload.as_ref().unwrap().as_ptr();
    let out = m.apply(r, None).unwrap();
    assert_eq!(out.payload.as_ref().unwrap().as_ptr(), before);
    assert_eq!(text(&out.payload), input);
    // An event type the rules are not for: nothing is even parsed (not-JSON passes too).
    s.masks = vec!["/card=redact".into()];
    s.event_type = Some(r"order\..*".into());
    let m = Masking::compile(s, false).unwrap();
    let out = m.apply(record("not json", &[]), Some("user.created.v1")).unwrap();
    assert_eq!(text(&out.payload), "not json");
    let out = m.apply(record(input, &[]), Some("order.paid.v1")).unwrap();
    assert_eq!(text(&out.payload), r#"{"total":1.0,"card":"***"}"#);
    // Matched whole, not searched for.
    assert_eq!(text(&m.apply(record(input, &[]), Some("x.order.paid")).unwrap().payload), input);
    // An unknown type gets the rules.
    assert_eq!(text(&m.apply(record(input, &[]), None).unwrap().payload), r#"{"total":1.0,"card":"***"}"#);
    // No rules at all.
    let none = Masking::compile(MaskSpec::default(), false).unwrap();
    assert!(none.is_empty());
    assert_eq!(text(&none.apply(record("not json", &[]), None).unwrap().payload), "not json");
}

#[test]
fn last4_and_hash() {
    for (input, want) in [
        ("4111111111111111", "************1111"),
        ("12345", "*2345"),
        ("1234", "****"),
        ("123", "***"),
        ("", ""),
        ("ñandú-éà", "****ú-éà"),
    ] {
        assert_eq!(edit::last4(input), want, "{input:?}");
    }
    let k = HashKey::from_bytes(&RFC4231_KEY).unwrap();
    assert_eq!(k.hex("Hi There"), RFC4231_HI_THERE);
    // Stable: the same value always gives the same pseudonym; a different one does not.
    assert_eq!(k.hex("alice@example.com"), k.hex("alice@example.com"));
    assert_ne!(k.hex("alice@example.com"), k.hex("bob@example.com"));
    assert!(HashKey::from_bytes(b"short").err().unwrap().contains("fewer than 16"));
    // Numbers by their JSON text, last4 of a number.
    let keys = Keys::new();
    let m = Masking::compile(spec(&["/n=hash", "/c=last4"], &keys), false).unwrap();
    let out = m.apply(record(r#"{"n":42,"c":4111111111111111}"#, &[]), None).unwrap();
    assert_eq!(text(&out.payload), format!(r#"{{"n":"{}","c":"************1111"}}"#, k.hex("42")));
}

#[test]
fn header_rules() {
    let keys = Keys::new();
    let m = Masking::compile(
        spec(&["headers/email=drop", "headers/user/email=redact", "headers/name=hash", "headers/card=last4"], &keys),
        false,
    )
    .unwrap();
    let r = record(
        r#"{"a":1}"#,
        &[
            ("id", "e-1"),
            ("email", "a@b.c"),
            ("user", r#"{"email":"a@b.c","id":7}"#),
            ("name", "Hi There"),
            ("card", "4111111111111111"),
        ],
    );
    let out = m.apply(r, None).unwrap();
    let h: Vec<(&str, &str)> = out.headers.iter().map(|(k, v)| (&**k, std::str::from_utf8(v).unwrap())).collect();
    assert_eq!(
        h,
        [
            ("id", "e-1"),
            ("user", r#"{"email":"***","id":7}"#),
            // The same pseudonym as the value would get in the payload: consumers can join on it.
            ("name", RFC4231_HI_THERE),
            ("card", "************1111"),
        ]
    );
    assert_eq!(text(&out.payload), r#"{"a":1}"#, "no payload rule");
    // A nested header rule on a header that is not JSON: it would leak, so the event is bad.
    let bad = m.apply(record("{}", &[("user", "plain text")]), None).unwrap_err();
    assert_eq!(bad.code, UNMASKABLE);
    assert!(bad.message.contains(r#"header "user""#), "{}", bad.message);
    assert_eq!(text(&bad.payload), "{}", "the payload itself was maskable and is kept");
    // Headers no rule names keep their Bytes.
    let r = record("{}", &[("trace", "t")]);
    let p = r.headers[0].1.as_ptr();
    assert_eq!(m.apply(r, None).unwrap().headers[0].1.as_ptr(), p);
}

#[test]
fn envelope_values_are_masked_inside_their_payload_member() {
    let keys = Keys::new();
    let m = Masking::compile(spec(&["/card=last4"], &keys), true).unwrap();
    let out = m.apply(record(r#"{"payload":{"card":"4111111111111111"},"card":"kept"}"#, &[]), None).unwrap();
    assert_eq!(text(&out.payload), r#"{"payload":{"card":"************1111"},"card":"kept"}"#);
    // A text payload inside an envelope is a JSON string: unmaskable, dropped from the DLQ copy.
    let bad = m.apply(record(r#"{"payload":"4111111111111111 as text"}"#, &[]), None).unwrap_err();
    assert_eq!((bad.code, bad.payload), (UNMASKABLE, None));
    // A tombstone (null payload) holds nothing.
    assert!(m.apply(record(r#"{"payload":null}"#, &[]), None).is_ok());
}

#[test]
fn dead_letter_copies_of_refused_rows_are_masked_or_dropped() {
    let keys = Keys::new();
    let m = Masking::compile(spec(&["/card=redact"], &keys), true).unwrap();
    let bad = |payload: &str| BadEvent {
        event_id: Some("e-1".into()),
        code: "null_route",
        message: "the route-by column is NULL".into(),
        topic: None,
        key: None,
        payload: Some(Bytes::copy_from_slice(payload.as_bytes())),
        headers: Vec::new(),
        payload_dropped: None,
    };
    // A refused row carries the column's value, never an envelope, whatever the placements.
    let b = m.scrub(bad(r#"{"card":"4111"}"#), None);
    assert_eq!((text(&b.payload), b.payload_dropped), (r#"{"card":"***"}"#, None));
    let b = m.scrub(bad("card 4111 as text"), None);
    assert_eq!(b.payload, None);
    assert!(b.payload_dropped.unwrap().contains("not JSON"));
    assert_eq!(b.code, "null_route", "the original reason stays");
    // Rules scoped to other event types leave it alone.
    let mut s = spec(&["/card=redact"], &keys);
    s.event_type = Some("order.*".into());
    let m = Masking::compile(s, false).unwrap();
    assert_eq!(text(&m.scrub(bad("as text"), Some("user.v1")).payload), "as text");
    assert_eq!(m.scrub(bad("as text"), Some("order.v1")).payload, None);
}

#[test]
fn encryption_round_trips_across_a_key_rotation() {
    let keys = Keys::new();
    let old_ring = keys.ring("old.json", &[("k1", 1)]);
    let new_ring = keys.ring("new.json", &[("k1", 1), ("k2", 2)]);
    let enc = |ring: &PathBuf| {
        let s = MaskSpec {
            encrypt: vec!["/card".into(), "headers/email".into(), "/items/*/n".into()],
            encrypt_key_file: Some(ring.clone()),
            ..MaskSpec::default()
        };
        Masking::compile(s, false).unwrap()
    };
    let input = r#"{"card":{"number":"4111","exp":"12/30"},"items":[{"n":10.50},{"n":"x"}],"k":1}"#;
    let before = enc(&old_ring).apply(record(input, &[("email", "a@b.c")]), None).unwrap();
    let after = enc(&new_ring).apply(record(input, &[("email", "a@b.c")]), None).unwrap();
    let kid = |r: &Record| -> String {
        let v: serde_json::Value = serde_json::from_slice(r.payload.as_ref().unwrap()).unwrap();
        assert_eq!(v["card"]["outboxd_enc"], 2, "{v}");
        assert_eq!(v["card"]["alg"], "XC20P");
        assert!(!v.to_string().contains("4111") && !v.to_string().contains("12/30"));
        v["card"]["kid"].as_str().unwrap().to_owned()
    };
    assert_eq!(kid(&before), "k1");
    assert_eq!(kid(&after), "k2", "new events use the newest key");
    // Two sealings of one value differ (random nonces).
    let again = enc(&new_ring).apply(record(input, &[]), None).unwrap();
    assert_ne!(after.payload, again.payload);
    let ring = Keyring::load("--encrypt-key-file", &new_ring).unwrap();
    for r in [&before, &after] {
        // As `--sink stdout` prints it, then `outboxd decrypt`.
        let line = crate::sink::record_json(r);
        let opened: serde_json::Value =
            serde_json::from_str(&decrypt::decrypt_line(&line, &ring, None).unwrap()).unwrap();
        assert_eq!(opened["payload"], serde_json::from_str::<serde_json::Value>(input).unwrap());
        assert_eq!(opened["headers"]["email"], "a@b.c");
        // The plaintext keeps the number's spelling.
        assert!(decrypt::decrypt_line(&line, &ring, None).unwrap().contains("10.50"));
    }
    // The old keyring cannot open what the new key sealed, and says which key it needs.
    let old = Keyring::load("--encrypt-key-file", &old_ring).unwrap();
    let e = decrypt::decrypt_line(&crate::sink::record_json(&after), &old, None).unwrap_err();
    assert!(e.contains("\"k2\"") && e.contains("not in the keyring"), "{e}");
    // A different key under the same kid, or a changed ciphertext, does not open.
    let impostor = Keyring::load("--encrypt-key-file", &keys.ring("bad.json", &[("k2", 9)])).unwrap();
    assert!(decrypt::decrypt_line(&crate::sink::record_json(&after), &impostor, None).is_err());
    // A line without sealed values comes back byte for byte.
    assert_eq!(decrypt::decrypt_line(r#"{"a": 1,  "b":"x"}"#, &ring, None).unwrap(), r#"{"a": 1,  "b":"x"}"#);
}

/// A sealed value is bound to its event and its field: moved to another event, another field or
/// another array element it does not open; version 1 values (bound to the key id only) still do.
#[test]
fn sealed_values_open_only_where_they_were_sealed() {
    let keys = Keys::new();
    let ring_path = keys.ring("ring.json", &[("k1", 1)]);
    let s = MaskSpec {
        encrypt: vec![
            "/ssn".into(),
            "/name".into(),
            "/items/*/n".into(),
            "headers/email".into(),
            "headers/user/email".into(),
        ],
        encrypt_key_file: Some(ring_path.clone()),
        ..MaskSpec::default()
    };
    let m = Masking::compile(s, false).unwrap();
    let ring = Keyring::load("--encrypt-key-file", &ring_path).unwrap();
    let input = r#"{"ssn":"123-45-6789","name":"Alice","items":[{"n":1},{"n":2}]}"#;
    let headers = [("id", "e-1"), ("email", "a@b.c"), ("user", r#"{"email":"x@y.z","id":7}"#)];
    let a = m.apply(record(input, &headers), None).unwrap();
    let mut other = record(input, &[("id", "e-2")]);
    other.event_id = "e-2".into();
    let b = m.apply(other, None).unwrap();
    let line = |r: &Record| crate::sink::record_json(r);
    let json = |r: &Record| serde_json::from_str::<serde_json::Value>(&line(r)).unwrap();
    // In place, everything opens, headers (whole and nested) too.
    let opened: serde_json::Value =
        serde_json::from_str(&decrypt::decrypt_line(&line(&a), &ring, None).unwrap()).unwrap();
    assert_eq!(opened["payload"], serde_json::from_str::<serde_json::Value>(input).unwrap());
    assert_eq!(opened["headers"]["email"], "a@b.c");
    assert_eq!(opened["headers"]["user"], r#"{"email":"x@y.z","id":7}"#);

    let refused = |v: serde_json::Value, why: &str| {
        let e = decrypt::decrypt_line(&v.to_string(), &ring, None).unwrap_err();
        assert!(e.contains("moved there from another event or field"), "{why}: {e}");
    };
    // Event e-1's ssn put into event e-2, at the same path.
    let mut moved = json(&b);
    moved["payload"]["ssn"] = json(&a)["payload"]["ssn"].clone();
    refused(moved, "another event");
    // Within one event: the ssn put in the name's place, and one array element in another's.
    let mut swapped = json(&a);
    swapped["payload"]["name"] = json(&a)["payload"]["ssn"].clone();
    refused(swapped, "another field");
    let mut swapped = json(&a);
    swapped["payload"]["items"][1]["n"] = json(&a)["payload"]["items"][0]["n"].clone();
    refused(swapped, "another element");
    // A payload field put into a header, and the id header changed.
    let mut to_header = json(&a);
    to_header["headers"]["email"] = serde_json::Value::String(json(&a)["payload"]["ssn"].to_string());
    refused(to_header, "payload to header");
    let mut relabelled = json(&a);
    relabelled["headers"]["id"] = "e-2".into();
    refused(relabelled, "id header changed");

    // A bare value (a consumer's dump of the payload) opens with --event-id, and only with the right one.
    let value = String::from_utf8(a.payload.clone().unwrap().to_vec()).unwrap();
    let e = decrypt::decrypt_line(&value, &ring, None).unwrap_err();
    assert!(e.contains("--event-id"), "{e}");
    let opened = decrypt::decrypt_line(&value, &ring, Some("e-1")).unwrap();
    assert_eq!(serde_json::from_str::<serde_json::Value>(&opened).unwrap()["ssn"], "123-45-6789");
    assert!(decrypt::decrypt_line(&value, &ring, Some("e-2")).is_err());

    // A version 1 value (sealed before binding existed: additional data = kid) still opens.
    use base64::Engine as _;
    use chacha20poly1305::aead::{Aead, KeyInit, Payload};
    let cipher = chacha20poly1305::XChaCha20Poly1305::new_from_slice(&[1u8; 32]).unwrap();
    let nonce = [7u8; 24];
    let ct = cipher
        .encrypt(chacha20poly1305::XNonce::from_slice(&nonce), Payload { msg: b"\"123-45-6789\"", aad: b"k1" })
        .unwrap();
    let b64 = base64::engine::general_purpose::STANDARD;
    let v1 = serde_json::json!({"ssn": {"outboxd_enc": 1, "alg": "XC20P", "kid": "k1",
        "nonce": b64.encode(nonce), "ct": b64.encode(ct)}});
    let opened = decrypt::decrypt_line(&v1.to_string(), &ring, None).unwrap();
    assert_eq!(opened, r#"{"ssn":"123-45-6789"}"#);
}

#[test]
fn bad_flags() {
    let keys = Keys::new();
    std::fs::write(keys.path("short.key"), "0123456789\n").unwrap();
    std::fs::write(keys.path("bad-ring.json"), r#"{"keys":[{"kid":"k1","key":"c2VjcmV0LWtleS1ieXRlcw=="}]}"#).unwrap();
    std::fs::write(keys.path("dup-ring.json"), r#"{"keys":[{"kid":"k","key":"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="},{"kid":"k","key":"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="}]}"#).unwrap();
    std::fs::write(keys.path("not-ring.json"), r#"{"keys": "s3cret-key-material"}"#).unwrap();
    let s = |masks: &[&str], f: &dyn Fn(&mut MaskSpec)| {
        let mut s = spec(masks, &keys);
        f(&mut s);
        Masking::compile(s, false).err().unwrap_or_default()
    };
    let no = |_: &mut MaskSpec| {};
    let cases: Vec<(String, &[&str])> = vec![
        (s(&["card/number=last4"], &no), &["--mask", "must start with /"]),
        (s(&["/card"], &no), &["--mask", "POINTER=ACTION"]),
        (s(&["/card=blur"], &no), &["--mask", "drop, redact, last4, hash"]),
        (s(&["/a~2=drop"], &no), &["--mask", "~"]),
        (s(&["headers/=drop"], &no), &["--mask", "headers/NAME"]),
        (s(&["/a=hash"], &|s| s.mask_key_file = None), &["--mask-key-file"]),
        (s(&["/a=hash"], &|s| s.mask_key_file = Some(keys.path("short.key"))), &["--mask-key-file", "fewer than 16"]),
        (s(&["/a=hash"], &|s| s.mask_key_file = Some(keys.path("missing"))), &["--mask-key-file", "cannot read"]),
        (s(&[], &|s| s.encrypt = vec!["/a".into()]), &["--encrypt-key-file"]),
        (s(&[], &|s| s.encrypt = vec!["a".into()]), &["--encrypt", "must start with /"]),
        (
            s(&[], &|s| (s.encrypt, s.encrypt_key_file) = (vec!["/a".into()], Some(keys.path("bad-ring.json")))),
            &["--encrypt-key-file", "not 32"],
        ),
        (
            s(&[], &|s| (s.encrypt, s.encrypt_key_file) = (vec!["/a".into()], Some(keys.path("dup-ring.json")))),
            &["--encrypt-key-file", "twice"],
        ),
        (
            s(&[], &|s| (s.encrypt, s.encrypt_key_file) = (vec!["/a".into()], Some(keys.path("not-ring.json")))),
            &["--encrypt-key-file", "not a keyring"],
        ),
        (s(&[], &|s| s.event_type = Some("x".into())), &["--mask-event-type", "scopes no rules"]),
        (s(&["/a=drop"], &|s| s.event_type = Some("(".into())), &["--mask-event-type", "does not compile"]),
    ];
    for (err, needles) in cases {
        for n in needles {
            assert!(err.contains(n), "{n:?} missing from {err:?}");
        }
        assert!(!err.contains('\n'), "one line: {err}");
        assert!(!err.contains("s3cret") && !err.contains("c2VjcmV0"), "key material in {err}");
    }
    // Key bytes never show in Debug either.
    let m = Masking::compile(spec(&["/a=hash"], &keys), false).unwrap();
    assert!(!format!("{m:?}").contains("11, 11"), "{m:?}");
}

/// A contract violation is dead-lettered as the routed record: its envelope and its headers are
/// masked like a delivered record's, and only outboxd's own headers survive unmaskable ones.
#[test]
fn contract_violations_are_scrubbed_like_records() {
    let keys = Keys::new();
    let violation = |payload: &str, headers: Vec<crate::router::Header>| BadEvent {
        event_id: Some("e-1".into()),
        code: crate::router::contract::CODE,
        message: "the payload violates the schema".into(),
        topic: Some("order.paid.v1.events".into()),
        key: None,
        payload: Some(Bytes::copy_from_slice(payload.as_bytes())),
        headers,
        payload_dropped: None,
    };
    let h = |k: &str, v: &str| (k.to_owned().into(), Bytes::copy_from_slice(v.as_bytes()));
    // Enveloped: the rule's pointer addresses the inside of `payload`.
    let m = Masking::compile(spec(&["/card=redact", "headers/email=drop"], &keys), true).unwrap();
    let b = m.scrub(
        violation(
            r#"{"payload":{"card":"4111"},"tenant":"t"}"#,
            vec![h("email", "a@b.c"), h("outboxd.schema.errors", "[]")],
        ),
        None,
    );
    assert_eq!(text(&b.payload), r#"{"payload":{"card":"***"},"tenant":"t"}"#);
    assert_eq!(b.headers.iter().map(|(k, _)| &**k).collect::<Vec<_>>(), vec!["outboxd.schema.errors"]);
    // A header a nested rule cannot reach (not JSON): dropped, our diagnostics kept.
    let m = Masking::compile(spec(&["headers/profile/email=redact"], &keys), false).unwrap();
    let b = m.scrub(violation(r#"{"a":1}"#, vec![h("profile", "not json"), h("outboxd.schema.errors", "[]")]), None);
    assert_eq!(b.headers.iter().map(|(k, _)| &**k).collect::<Vec<_>>(), vec!["outboxd.schema.errors"]);
}
