//! A walk over an Avro binary datum by its schema, before apache-avro decodes it: the bytes must
//! be exactly one datum of the schema, no deeper than [`MAX_DEPTH`] levels.
//!
//! Why not leave it to apache-avro: it decodes, validates and converts to JSON recursively, one
//! stack frame per level, and a recursive schema (a linked list, a tree) lets a record nest about
//! one level per byte, so a few hundred kilobytes overflow the stack and abort the process, which
//! then crash-loops on the same record. And it reads the end of the bytes as a value in places (a
//! union or a boolean at the end reads as null), so a value cut short before a trailing
//! `["null", X]` field would pass as complete.
//!
//! Invariant: the walk reads only what the schema says, never past the end (cut short is an
//! error, not a null), allocates nothing per item, and counts a level per record, array, map and
//! union, so apache-avro's recursion after it is bounded. A collection may claim at most as many
//! items as apache-avro would allocate under `max_bytes` (items of no bytes, such as nulls, would
//! otherwise loop for a claimed 2^62 of them).

use apache_avro::schema::{InnerDecimalSchema, Name, NamesRef, NamespaceRef, ResolvedSchema, UuidSchema};
use apache_avro::types::Value;
use apache_avro::Schema;

/// The deepest nesting walked, as PostgreSQL's `jsonb` and serde_json allow.
pub const MAX_DEPTH: usize = 128;

/// `Ok` when `body` is exactly one datum of `schema`, nested at most [`MAX_DEPTH`] levels.
pub fn check(schema: &Schema, body: &[u8], max_bytes: usize) -> Result<(), String> {
    let resolved = ResolvedSchema::try_from(schema).map_err(|e| format!("the schema's names do not resolve: {e}"))?;
    let max_items = max_bytes / std::mem::size_of::<Value>().max(1);
    let mut walk = Walk { names: resolved.get_names(), rest: body, max_items };
    walk.value(schema, None, 0)?;
    if !walk.rest.is_empty() {
        return Err(format!("{} bytes are left after the Avro datum", walk.rest.len()));
    }
    Ok(())
}

struct Walk<'s, 'b> {
    names: &'s NamesRef<'s>,
    rest: &'b [u8],
    max_items: usize,
}

impl Walk<'_, '_> {
    fn take(&mut self, n: u64) -> Result<(), String> {
        match usize::try_from(n).ok().filter(|n| *n <= self.rest.len()) {
            Some(n) => {
                self.rest = &self.rest[n..];
                Ok(())
            }
            None => Err(format!("it is cut short: {n} bytes wanted, {} left", self.rest.len())),
        }
    }

    /// A zigzag varint (int, long, a length, a count, an index), at most 10 bytes.
    fn long(&mut self) -> Result<i64, String> {
        let mut n: u64 = 0;
        for i in 0..10 {
            let (&b, rest) = self.rest.split_first().ok_or_else(|| "it is cut short inside a number".to_owned())?;
            self.rest = rest;
            n |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                return Ok((n >> 1) as i64 ^ -((n & 1) as i64));
            }
        }
        Err("a number longer than 10 bytes".into())
    }

    fn bytes(&mut self) -> Result<(), String> {
        let n = self.long()?;
        let n = u64::try_from(n).map_err(|_| format!("a negative length, {n}"))?;
        self.take(n)
    }

    /// An array's or a map's blocks: a count (negative: followed by the block's size in bytes),
    /// the items, until a count of 0.
    fn blocks(
        &mut self,
        depth: usize,
        mut item: impl FnMut(&mut Self, usize) -> Result<(), String>,
    ) -> Result<(), String> {
        let mut total: u64 = 0;
        loop {
            let count = self.long()?;
            if count == 0 {
                return Ok(());
            }
            if count < 0 {
                self.long()?;
            }
            total = total.saturating_add(count.unsigned_abs());
            if total > self.max_items as u64 {
                return Err(format!("a collection claims {total} items, more than {} allowed", self.max_items));
            }
            for _ in 0..count.unsigned_abs() {
                item(self, depth + 1)?;
            }
        }
    }

    fn value(&mut self, schema: &Schema, ns: NamespaceRef, depth: usize) -> Result<(), String> {
        if depth > MAX_DEPTH {
            return Err(format!("it is nested deeper than {MAX_DEPTH} levels"));
        }
        match schema {
            Schema::Null => Ok(()),
            Schema::Boolean => match self.rest.first() {
                Some(0 | 1) => self.take(1),
                Some(b) => Err(format!("{b} is not a boolean")),
                None => Err("it is cut short before a boolean".into()),
            },
            Schema::Int
            | Schema::Long
            | Schema::Enum(_)
            | Schema::Date
            | Schema::TimeMillis
            | Schema::TimeMicros
            | Schema::TimestampMillis
            | Schema::TimestampMicros
            | Schema::TimestampNanos
            | Schema::LocalTimestampMillis
            | Schema::LocalTimestampMicros
            | Schema::LocalTimestampNanos => self.long().map(drop),
            Schema::Float => self.take(4),
            Schema::Double => self.take(8),
            Schema::Bytes
            | Schema::String
            | Schema::BigDecimal
            | Schema::Uuid(UuidSchema::Bytes | UuidSchema::String)
            | Schema::Decimal(apache_avro::schema::DecimalSchema { inner: InnerDecimalSchema::Bytes, .. }) => {
                self.bytes()
            }
            Schema::Fixed(f)
            | Schema::Duration(f)
            | Schema::Uuid(UuidSchema::Fixed(f))
            | Schema::Decimal(apache_avro::schema::DecimalSchema { inner: InnerDecimalSchema::Fixed(f), .. }) => {
                self.take(f.size as u64)
            }
            Schema::Array(a) => self.blocks(depth, |w, d| w.value(&a.items, ns, d)),
            Schema::Map(m) => self.blocks(depth, |w, d| {
                w.bytes()?;
                w.value(&m.types, ns, d)
            }),
            Schema::Union(u) => {
                let i = self.long()?;
                let branch = usize::try_from(i)
                    .ok()
                    .and_then(|i| u.variants().get(i))
                    .ok_or_else(|| format!("union branch {i} of {}", u.variants().len()))?;
                self.value(branch, ns, depth + 1)
            }
            Schema::Record(r) => {
                let name = r.name.fully_qualified_name(ns);
                for f in &r.fields {
                    self.value(&f.schema, name.namespace(), depth + 1)?;
                }
                Ok(())
            }
            Schema::Ref { name } => {
                let name: Name = name.fully_qualified_name(ns).into_owned();
                let s = self.names.get(&name).ok_or_else(|| format!("the schema names {name:?}, not defined"))?;
                // The record it names counts the level.
                self.value(s, name.namespace(), depth)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A linked list: each level one union index byte and one record level.
    const LIST: &str = r#"{"type":"record","name":"Node","fields":[
        {"name":"next","type":["null","Node"]}]}"#;

    fn nested(levels: usize) -> Vec<u8> {
        let mut b = vec![2u8; levels]; // branch 1: another Node
        b.push(0); // branch 0: null
        b
    }

    #[test]
    fn depth_is_bounded_and_the_end_is_not_a_value() {
        let s = Schema::parse_str(LIST).unwrap();
        assert_eq!(check(&s, &nested(10), 64 << 20), Ok(()));
        let e = check(&s, &nested(5000), 64 << 20).unwrap_err();
        assert!(e.contains("deeper than 128"), "{e}");
        // Cut short before the last union: not null.
        let e = check(&s, &nested(10)[..10], 64 << 20).unwrap_err();
        assert!(e.contains("cut short"), "{e}");
        assert!(check(&s, &[0, 0], 64 << 20).unwrap_err().contains("left after"));
    }

    #[test]
    fn a_collection_of_nothing_cannot_claim_billions_of_items() {
        let s = Schema::parse_str(r#"{"type":"array","items":"null"}"#).unwrap();
        assert_eq!(check(&s, &[6, 0], 64 << 20), Ok(()), "3 nulls");
        // A count of 2^62: refused at once, not looped over.
        let e = check(&s, &[0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01, 0], 64 << 20).unwrap_err();
        assert!(e.contains("more than"), "{e}");
    }
}
