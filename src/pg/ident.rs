//! Names in SQL text: the one quoting of an identifier for every statement we build (the catalog
//! checks, `poll`, `backfill`, `status`, the tools). Always quoted, so a name is taken exactly as
//! configured (case kept, no keyword clash); an embedded `"` is doubled, so no name can end the
//! identifier early.

use crate::config::TableName;

/// `"name"` with embedded quotes doubled.
pub fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// `"schema"."table"`.
pub fn quote_table(t: &TableName) -> String {
    format!("{}.{}", quote_ident(&t.schema), quote_ident(&t.name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotes_are_doubled_and_case_kept() {
        assert_eq!(quote_ident("published_at"), "\"published_at\"");
        assert_eq!(quote_ident("we\"ird"), "\"we\"\"ird\"");
        assert_eq!(quote_ident("Kind"), "\"Kind\"");
        let t = TableName { schema: "app".into(), name: "Out\"box".into() };
        assert_eq!(quote_table(&t), "\"app\".\"Out\"\"box\"");
    }
}
