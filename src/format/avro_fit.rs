//! Why a JSON payload does not fit an Avro schema, as a [`Mismatch`] naming the field.
//!
//! It walks the payload with the schema the way [`super::avro`] maps JSON onto Avro (records and
//! maps from objects, a union's first branch that fits, missing record fields from their
//! defaults). Each leaf value (a number, a string, a logical type) is judged by the Avro library
//! itself, so the explanation agrees with the encoder on what fits; only the words are ours.

use std::collections::HashMap;

use apache_avro::schema::{RecordField, UnionSchema};
use apache_avro::types::Value as Avro;
use apache_avro::Schema;
use serde_json::Value;

use super::mismatch::{list, Mismatch, Path, Step};

/// The first place where `json` does not fit `schema`; `None` when the walk finds none.
pub fn explain(schema: &Schema, json: &Value) -> Option<Mismatch> {
    let mut named = HashMap::new();
    collect_named(schema, &mut named);
    Walk { named }.fit(schema, json, &Path::default()).err()
}

/// Named types by full and short name, for `Schema::Ref`.
fn collect_named<'s>(schema: &'s Schema, named: &mut HashMap<String, &'s Schema>) {
    let mut add = |name: &apache_avro::schema::Name| {
        named.insert(name.fullname(None), schema);
        named.entry(name.name().to_owned()).or_insert(schema);
    };
    match schema {
        Schema::Record(r) => {
            add(&r.name);
            for f in &r.fields {
                collect_named(&f.schema, named);
            }
        }
        Schema::Enum(e) => add(&e.name),
        Schema::Fixed(f) => add(&f.name),
        Schema::Array(a) => collect_named(&a.items, named),
        Schema::Map(m) => collect_named(&m.types, named),
        Schema::Union(u) => u.variants().iter().for_each(|v| collect_named(v, named)),
        _ => {}
    }
}

struct Walk<'s> {
    named: HashMap<String, &'s Schema>,
}

impl<'s> Walk<'s> {
    fn fit(&self, schema: &'s Schema, json: &Value, at: &Path) -> Result<(), Mismatch> {
        match schema {
            Schema::Ref { name } => match self.resolve(name) {
                Some(s) => self.fit(s, json, at),
                None => Ok(()),
            },
            Schema::Record(r) => self.record(&r.name.name(), &r.fields, json, at),
            Schema::Map(m) => match json {
                Value::Object(o) => {
                    o.iter().try_for_each(|(k, v)| self.fit(&m.types, v, &at.with(Step::Key(k.clone()))))
                }
                other => Err(Mismatch::expected(at, &self.expectation(schema), other)),
            },
            Schema::Array(a) => match json {
                Value::Array(items) => {
                    items.iter().enumerate().try_for_each(|(i, v)| self.fit(&a.items, v, &at.with(Step::Index(i))))
                }
                other => Err(Mismatch::expected(at, &self.expectation(schema), other)),
            },
            Schema::Union(u) => self.union(u, json, at),
            Schema::Enum(e) => match json {
                Value::String(s)
                    if e.symbols.contains(s) || e.default.as_ref().is_some_and(|d| e.symbols.contains(d)) =>
                {
                    Ok(())
                }
                Value::String(s) => Err(Mismatch::new(
                    at,
                    format!("{} is not one of the enum's symbols {}", super::mismatch::quoted(s), list(&e.symbols)),
                )),
                other => Err(Mismatch::expected(at, &self.expectation(schema), other)),
            },
            // The library accepts a string of any length here; the writer then refuses it.
            Schema::Fixed(f) => match json {
                Value::String(s) if s.len() == f.size => Ok(()),
                Value::String(s) => Err(Mismatch::new(
                    at,
                    format!("expected {}, got a string of {} bytes", self.expectation(schema), s.len()),
                )),
                other => Err(Mismatch::expected(at, &self.expectation(schema), other)),
            },
            leaf => {
                let fits = Avro::try_from(json.clone()).and_then(|v| v.resolve(leaf)).is_ok();
                if fits {
                    Ok(())
                } else {
                    Err(Mismatch::expected(at, &self.expectation(leaf), json))
                }
            }
        }
    }

    fn record(&self, name: &str, fields: &'s [RecordField], json: &Value, at: &Path) -> Result<(), Mismatch> {
        let Value::Object(o) = json else {
            return Err(Mismatch::expected(at, &format!("a record {name} (an object)"), json));
        };
        for f in fields {
            let here = at.with(Step::Field(f.name.clone()));
            match o.get(&f.name) {
                Some(v) => self.fit(&f.schema, v, &here)?,
                None if f.default.is_some() => {}
                None => {
                    return Err(Mismatch::new(
                        &here,
                        format!("missing, and the schema gives no default ({} expected)", self.expectation(&f.schema)),
                    ))
                }
            }
        }
        Ok(())
    }

    /// A union fits when one branch does. Otherwise the reason comes from the one branch of the
    /// value's kind (so a mismatch deep in `["null", Order]` names the field in the order), or
    /// lists the branches.
    fn union(&self, u: &'s UnionSchema, json: &Value, at: &Path) -> Result<(), Mismatch> {
        let mut same_kind = Vec::new();
        for v in u.variants() {
            match self.fit(v, json, at) {
                Ok(()) => return Ok(()),
                Err(m) if self.same_kind(v, json) => same_kind.push(m),
                Err(_) => {}
            }
        }
        if same_kind.len() == 1 {
            return Err(same_kind.remove(0));
        }
        Err(Mismatch::expected(at, &self.expectation(&Schema::Union(u.clone())), json))
    }

    /// Whether `json` is the kind of value `schema` takes (an object for a record, a number for
    /// an int, ...), whatever its details.
    fn same_kind(&self, schema: &'s Schema, json: &Value) -> bool {
        let schema = match schema {
            Schema::Ref { name } => match self.resolve(name) {
                Some(s) => s,
                None => return false,
            },
            s => s,
        };
        match json {
            Value::Null => matches!(schema, Schema::Null),
            Value::Bool(_) => matches!(schema, Schema::Boolean),
            Value::Number(_) => matches!(
                schema,
                Schema::Int
                    | Schema::Long
                    | Schema::Float
                    | Schema::Double
                    | Schema::Date
                    | Schema::TimeMillis
                    | Schema::TimeMicros
                    | Schema::TimestampMillis
                    | Schema::TimestampMicros
                    | Schema::TimestampNanos
                    | Schema::LocalTimestampMillis
                    | Schema::LocalTimestampMicros
                    | Schema::LocalTimestampNanos
            ),
            Value::String(_) => {
                matches!(schema, Schema::String | Schema::Bytes | Schema::Enum(_) | Schema::Fixed(_) | Schema::Uuid(_))
            }
            Value::Array(_) => matches!(schema, Schema::Array(_)),
            Value::Object(_) => matches!(schema, Schema::Record(_) | Schema::Map(_)),
        }
    }

    fn resolve(&self, name: &apache_avro::schema::Name) -> Option<&'s Schema> {
        self.named.get(&name.fullname(None)).or_else(|| self.named.get(name.name())).copied()
    }

    /// What `schema` takes, in words.
    fn expectation(&self, schema: &Schema) -> String {
        match schema {
            Schema::Null => "null".into(),
            Schema::Boolean => "a boolean".into(),
            Schema::Int => "an int (32-bit)".into(),
            Schema::Long => "a long (64-bit integer)".into(),
            Schema::Float => "a float".into(),
            Schema::Double => "a double".into(),
            Schema::Bytes => "bytes (a string)".into(),
            Schema::String => "a string".into(),
            Schema::Array(_) => "an array".into(),
            Schema::Map(_) => "a map (an object)".into(),
            Schema::Union(u) => {
                let each: Vec<String> = u.variants().iter().map(|v| self.expectation(v)).collect();
                each.join(" or ")
            }
            Schema::Record(r) => format!("a record {} (an object)", r.name.name()),
            Schema::Enum(e) => format!("one of the enum's symbols {}", list(&e.symbols)),
            Schema::Fixed(f) => format!("a fixed of {} bytes (a string)", f.size),
            Schema::Decimal(d) => format!("a decimal of precision {} and scale {} (its bytes)", d.precision, d.scale),
            Schema::BigDecimal => "a big-decimal (its bytes)".into(),
            Schema::Uuid(_) => "a UUID (a string)".into(),
            Schema::Date => "a date (days since 1970-01-01, an int)".into(),
            Schema::TimeMillis => "a time of day in milliseconds (an int)".into(),
            Schema::TimeMicros => "a time of day in microseconds (a long)".into(),
            Schema::TimestampMillis | Schema::LocalTimestampMillis => "a timestamp in milliseconds (a long)".into(),
            Schema::TimestampMicros | Schema::LocalTimestampMicros => "a timestamp in microseconds (a long)".into(),
            Schema::TimestampNanos | Schema::LocalTimestampNanos => "a timestamp in nanoseconds (a long)".into(),
            Schema::Duration(_) => "a duration (12 bytes)".into(),
            Schema::Ref { name } => match self.resolve(name) {
                Some(s) => self.expectation(s),
                None => format!("a {}", name.name()),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const PRICE: &str = r#"{"type":"record","name":"Price","namespace":"shop.v1","fields":[
        {"name":"amount","type":"int"},
        {"name":"price","type":"double"},
        {"name":"currency","type":{"type":"enum","name":"Currency","symbols":["EUR","USD"]}},
        {"name":"tag","type":{"type":"fixed","name":"Tag","size":4}},
        {"name":"note","type":["null","string"],"default":null},
        {"name":"lines","type":{"type":"array","items":{"type":"record","name":"Line","fields":[
            {"name":"sku","type":"string"},{"name":"qty","type":"long"}]}}},
        {"name":"next","type":["null","Line"],"default":null},
        {"name":"attrs","type":{"type":"map","values":"int"},"default":{}},
        {"name":"day","type":{"type":"int","logicalType":"date"},"default":0}]}"#;

    fn good() -> Value {
        json!({"amount": 1, "price": 1.5, "currency": "EUR", "tag": "abcd", "lines": [{"sku": "a", "qty": 2}]})
    }

    /// Each case: a change to a good payload, and the reason the explainer gives.
    #[test]
    fn each_mismatch_names_its_field_and_the_expectation_in_words() {
        let schema = Schema::parse_str(PRICE).unwrap();
        assert_eq!(explain(&schema, &good()), None);
        let cases: &[(&str, Value, &str)] = &[
            ("amount", json!(1099511627776u64), r#"field "amount": expected an int (32-bit), got 1099511627776"#),
            ("amount", json!(1.5), r#"field "amount": expected an int (32-bit), got 1.5"#),
            ("price", json!("twelve"), r#"field "price": expected a double, got a string "twelve""#),
            ("currency", json!("JPY"), r#"field "currency": "JPY" is not one of the enum's symbols [EUR, USD]"#),
            ("currency", json!(3), r#"field "currency": expected one of the enum's symbols [EUR, USD], got 3"#),
            ("tag", json!("abc"), r#"field "tag": expected a fixed of 4 bytes (a string), got a string of 3 bytes"#),
            ("note", json!(5), r#"field "note": expected null or a string, got 5"#),
            (
                "lines",
                json!([{"sku": "a", "qty": 1}, {"sku": 7, "qty": 1}]),
                r#"field "lines[1].sku": expected a string, got 7"#,
            ),
            (
                "lines",
                json!([{"sku": "a"}]),
                r#"field "lines[0].qty": missing, and the schema gives no default (a long (64-bit integer) expected)"#,
            ),
            (
                "next",
                json!({"sku": "a", "qty": "two"}),
                r#"field "next.qty": expected a long (64-bit integer), got a string "two""#,
            ),
            ("attrs", json!({"k": "v"}), r#"field "attrs["k"]": expected an int (32-bit), got a string "v""#),
            (
                "day",
                json!("2026-12-05"),
                r#"field "day": expected a date (days since 1970-01-01, an int), got a string "2026-12-05""#,
            ),
        ];
        for (field, value, want) in cases {
            let mut p = good();
            p[*field] = value.clone();
            assert_eq!(explain(&schema, &p).map(|m| m.to_string()).as_deref(), Some(*want), "{field}: {value}");
        }
        let mut p = good();
        p.as_object_mut().unwrap().remove("price");
        assert_eq!(
            explain(&schema, &p).unwrap().to_string(),
            r#"field "price": missing, and the schema gives no default (a double expected)"#
        );
        assert_eq!(
            explain(&schema, &json!([1])).unwrap().to_string(),
            "the payload: expected a record Price (an object), got an array of 1 item"
        );
    }
}
