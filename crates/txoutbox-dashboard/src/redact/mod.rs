//! Hides configured fields before anything reaches the browser: every object member with a
//! listed name (without case), at any depth, has its value replaced.

use serde_json::Value;

/// What a redacted value becomes.
pub(crate) const REDACTED: &str = "[redacted]";

/// True when `name` is one of `fields`.
pub(crate) fn is_redacted(fields: &[String], name: &str) -> bool {
    fields.iter().any(|f| f.eq_ignore_ascii_case(name))
}

/// `value` with every member named in `fields` (at any depth, in arrays too) replaced.
pub(crate) fn redact(fields: &[String], value: &mut Value) {
    if fields.is_empty() {
        return;
    }
    match value {
        Value::Object(map) => {
            for (name, member) in map.iter_mut() {
                if is_redacted(fields, name) {
                    *member = Value::String(REDACTED.into());
                } else {
                    redact(fields, member);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|v| redact(fields, v)),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listed_fields_are_replaced_at_any_depth() {
        let fields = vec!["email".to_owned(), "card".to_owned()];
        let mut v = serde_json::json!({
            "Email": "a@b.c",
            "order": {"items": [{"card": {"number": "4242"}, "sku": "x"}]},
            "note": "email",
        });
        redact(&fields, &mut v);
        assert_eq!(
            v,
            serde_json::json!({
                "Email": REDACTED,
                "order": {"items": [{"card": REDACTED, "sku": "x"}]},
                "note": "email",
            })
        );
    }
}
