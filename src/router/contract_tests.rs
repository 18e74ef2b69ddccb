//! Contract checks against real schema files in a temporary directory.

use super::*;

const ORDER_PAID: &str = r#"{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "type": "object",
  "required": ["orderId", "amount"],
  "properties": {
    "orderId": {"type": "string"},
    "amount": {"type": "integer", "minimum": 0},
    "email": {"type": "string", "format": "email"},
    "items": {"type": "array", "items": {"type": "object", "required": ["sku"]}}
  }
}"#;

fn dir_with(files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (name, text) in files {
        std::fs::write(dir.path().join(name), text).unwrap();
    }
    dir
}

fn set(files: &[(&str, &str)]) -> (tempfile::TempDir, SchemaSet) {
    let dir = dir_with(files);
    let set = SchemaSet::load(dir.path()).unwrap();
    (dir, set)
}

fn violation(v: Verdict) -> Violation {
    match v {
        Verdict::Violation(v) => v,
        other => panic!("expected a violation, got {other:?}"),
    }
}

#[test]
fn a_conforming_payload_is_valid() {
    let (_d, s) = set(&[("order.paid.v1.json", ORDER_PAID), ("README.md", "not a schema"), (".swap.json", "{")]);
    assert_eq!(s.len(), 1, "only <event_type>.json files, hidden ones ignored");
    let p = br#"{"orderId": "o-1", "amount": 1050, "email": "a@example.com", "items": [{"sku": "x"}]}"#;
    assert_eq!(s.check(SchemaMissing::Allow, Some("order.paid.v1"), Some(p)), Verdict::Valid);
    assert_eq!(s.check(SchemaMissing::Reject, Some("order.paid.v1"), Some(p)), Verdict::Valid);
}

#[test]
fn a_violation_names_each_path_and_never_quotes_the_values() {
    let (d, s) = set(&[("order.paid.v1.json", ORDER_PAID)]);
    let p = br#"{"amount": "secret-4111111111111111", "email": "not-an-email", "items": [{"sku": "a"}, {}]}"#;
    let v = violation(s.check(SchemaMissing::Allow, Some("order.paid.v1"), Some(p)));
    let paths: Vec<&str> = v.errors.iter().map(|e| e.path.as_str()).collect();
    for want in ["/", "/amount", "/email", "/items/1"] {
        assert!(paths.contains(&want), "{want} missing from {:?}", v.errors);
    }
    let missing = v.errors.iter().find(|e| e.path == "/").unwrap();
    assert!(missing.message.contains("\"orderId\" is a required property"), "{missing:?}");
    let amount = v.errors.iter().find(|e| e.path == "/amount").unwrap();
    assert!(amount.message.contains("\"integer\""), "{amount:?}");
    assert!(v.message.contains("\"order.paid.v1\""), "{}", v.message);
    assert!(v.message.contains(&d.path().join("order.paid.v1.json").display().to_string()), "{}", v.message);
    assert!(v.message.contains("(and 3 more errors)"), "{}", v.message);
    let (name, value) = v.header().unwrap();
    assert_eq!(name, H_ERRORS);
    let header: Vec<serde_json::Value> = serde_json::from_slice(&value).unwrap();
    assert_eq!(header.len(), 4);
    assert!(header.iter().all(|e| e["path"].is_string() && e["message"].is_string()));
    let all = format!("{} {}", v.message, String::from_utf8_lossy(&value));
    assert!(!all.contains("4111") && !all.contains("not-an-email"), "values leaked: {all}");
}

#[test]
fn errors_are_bounded_in_number_and_length() {
    // Twenty required properties with long names: twenty errors, each message over the limit.
    let names: Vec<String> = (0..20).map(|i| format!(r#""p{i:0>150}""#)).collect();
    let schema = format!(r#"{{"type": "object", "required": [{}]}}"#, names.join(","));
    let (_d, s) = set(&[("wide.json", &schema)]);
    let v = violation(s.check(SchemaMissing::Allow, Some("wide"), Some(b"{}")));
    assert_eq!(v.errors.len(), MAX_ERRORS);
    assert!(v.errors.iter().all(|e| e.message.len() <= MAX_MESSAGE), "{:?}", v.errors);
    assert!(v.message.contains("(and 19 more errors)"), "{}", v.message);
    assert!(v.header().unwrap().1.len() < 1200);
}

#[test]
fn a_missing_schema_is_allowed_or_rejected() {
    let (_d, s) = set(&[("order.paid.v1.json", ORDER_PAID)]);
    assert_eq!(s.check(SchemaMissing::Allow, Some("order.created.v1"), Some(b"not even json")), Verdict::Unchecked);
    assert_eq!(s.check(SchemaMissing::Allow, None, Some(b"{}")), Verdict::Unchecked);
    let v = violation(s.check(SchemaMissing::Reject, Some("order.created.v1"), Some(b"{}")));
    assert!(v.message.contains("\"order.created.v1\" has no schema (order.created.v1.json)"), "{}", v.message);
    assert!(v.message.contains("--schema-missing allow"), "{}", v.message);
    assert!(v.header().is_none());
    let v = violation(s.check(SchemaMissing::Reject, None, Some(b"{}")));
    assert!(v.message.contains("event type column is NULL"), "{}", v.message);
}

#[test]
fn a_payload_that_is_not_json_cannot_pass_a_schema() {
    let (_d, s) = set(&[("order.paid.v1.json", ORDER_PAID)]);
    let v = violation(s.check(SchemaMissing::Allow, Some("order.paid.v1"), Some(b"card=4111111111111111")));
    assert!(v.message.starts_with("the payload is not JSON (syntax error at line 1 column 1)"), "{}", v.message);
    assert!(v.message.contains("order.paid.v1.json"), "{}", v.message);
    assert!(!v.message.contains("4111"), "{}", v.message);
    assert!(v.header().is_none());
    let v = violation(s.check(SchemaMissing::Allow, Some("order.paid.v1"), Some(&[0xff, 0xfe])));
    assert!(v.message.contains("not JSON"), "{}", v.message);
    // A NULL payload (a tombstone) carries no contract.
    assert_eq!(s.check(SchemaMissing::Reject, Some("order.paid.v1"), None), Verdict::Unchecked);
}

#[test]
fn bad_schema_files_fail_with_the_file_and_the_fix() {
    let cases = [
        ("{ not json", "not JSON"),
        (r#"{"type": 5}"#, "not a valid draft 2020-12 schema"),
        (r#"{"$ref": "https://example.com/remote.json"}"#, "not a valid draft 2020-12 schema"),
        (r#"{"$ref": "common.json"}"#, "no $ref to other files"),
    ];
    for (text, want) in cases {
        let d = dir_with(&[("bad.type.json", text)]);
        let e = SchemaSet::load(d.path()).err().unwrap_or_else(|| panic!("{text} should not compile"));
        assert!(e.contains(&d.path().join("bad.type.json").display().to_string()), "{e}");
        assert!(e.contains(want), "{text}: {e}");
        assert!(!e.contains('\n'), "one line: {e}");
    }
    let e = SchemaSet::load(Path::new("/nonexistent/schemas")).err().unwrap();
    assert!(e.starts_with("--schema-dir /nonexistent/schemas: cannot read it"), "{e}");
}

#[test]
fn reload_swaps_the_set_and_a_failed_reload_keeps_the_old_one() {
    let d = dir_with(&[("order.paid.v1.json", ORDER_PAID)]);
    let c = Contracts::load(d.path(), SchemaMissing::Allow).unwrap();
    let shared = c.clone();
    let p: &[u8] = br#"{"orderId": "o-1", "amount": 5}"#;
    assert_eq!(c.check(Some("order.paid.v1"), Some(p)), Verdict::Valid);
    std::fs::write(d.path().join("order.paid.v1.json"), r#"{"required": ["currency"]}"#).unwrap();
    assert_eq!(c.check(Some("order.paid.v1"), Some(p)), Verdict::Valid, "nothing changes before a reload");
    assert_eq!(shared.reload(), Ok(1));
    let v = violation(c.check(Some("order.paid.v1"), Some(p)));
    assert!(v.message.contains("\"currency\" is a required property"), "{}", v.message);
    std::fs::write(d.path().join("broken.json"), "{").unwrap();
    let e = shared.reload().unwrap_err();
    assert!(e.contains("broken.json") && e.contains("still using the 1 schemas loaded before"), "{e}");
    assert!(matches!(c.check(Some("order.paid.v1"), Some(p)), Verdict::Violation(_)), "old set kept");
}
