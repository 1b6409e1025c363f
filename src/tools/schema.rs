//! JSON Schemas of tool arguments, generated from the `Args` types, and the validator that checks
//! arguments against exactly that schema before they are deserialized.
//!
//! One schema serves both ends: what the model is shown in `tools` is what [`validate`] enforces, so the
//! limits written once in `#[schemars(length(..), range(..), regex(..))]` can never drift apart.

use std::{
    collections::HashMap,
    sync::{LazyLock, Mutex},
};

use schemars::{JsonSchema, generate::SchemaSettings};
use serde_json::{Map, Value};

/// Compiled `pattern`s of the tools' schemas (a handful, fixed at compile time): compiling one costs more
/// than the rest of a tool call's validation, so each is compiled once.
static PATTERNS: LazyLock<Mutex<HashMap<String, Option<regex::Regex>>>> =
    LazyLock::new(Default::default);
/// Bound on [`PATTERNS`], should schemas ever carry patterns from elsewhere.
const MAX_PATTERNS: usize = 64;

/// Whether `text` matches `pattern`; `None` when the pattern does not compile.
fn pattern_matches(pattern: &str, text: &str) -> Option<bool> {
    let mut cache = PATTERNS.lock().expect("pattern cache lock");
    if let Some(re) = cache.get(pattern) {
        return re.as_ref().map(|re| re.is_match(text));
    }
    let re = regex::Regex::new(pattern).ok();
    let matched = re.as_ref().map(|re| re.is_match(text));
    if cache.len() < MAX_PATTERNS {
        cache.insert(pattern.to_owned(), re);
    }
    matched
}

/// The `parameters` schema of a tool whose arguments are `T`: inline (no `$ref`), without the
/// meta-schema, titles or integer formats some providers reject, and with optional fields as plain
/// (non-nullable) types. A `null` sent for an optional field is treated as absent (see [`normalize`]).
pub(crate) fn parameters_for<T: JsonSchema>() -> Value {
    let generator = SchemaSettings::draft07()
        .with(|s| {
            s.inline_subschemas = true;
            s.meta_schema = None;
        })
        .into_generator();
    let mut schema = generator.into_root_schema_for::<T>().to_value();
    tidy(&mut schema);
    if let Value::Object(o) = &mut schema {
        o.entry("properties")
            .or_insert_with(|| Value::Object(Map::new()));
    }
    schema
}

fn tidy(v: &mut Value) {
    let Value::Object(o) = v else { return };
    o.remove("title");
    o.remove("$schema");
    o.remove("format");
    if o.get("default") == Some(&Value::Null) {
        o.remove("default");
    }
    // `Option<T>`: `type: [T, "null"]` or `anyOf: [T, {type: null}]` → T.
    if let Some(Value::Array(types)) = o.get("type") {
        let non_null: Vec<Value> = types.iter().filter(|t| *t != "null").cloned().collect();
        if non_null.len() == 1 {
            o.insert("type".into(), non_null[0].clone());
        }
    }
    if let Some(Value::Array(e)) = o.get_mut("enum") {
        e.retain(|x| !x.is_null());
    }
    for key in ["anyOf", "oneOf"] {
        if let Some(Value::Array(alts)) = o.get(key) {
            let non_null: Vec<Value> = alts
                .iter()
                .filter(|a| a.get("type") != Some(&Value::String("null".into())))
                .cloned()
                .collect();
            if non_null.len() == 1 && alts.len() == 2 {
                o.remove(key);
                if let Value::Object(inner) = non_null[0].clone() {
                    for (k, val) in inner {
                        o.entry(k).or_insert(val);
                    }
                }
            }
        }
    }
    for (_, child) in o.iter_mut() {
        match child {
            Value::Object(_) => tidy(child),
            Value::Array(items) => items.iter_mut().for_each(tidy),
            _ => {}
        }
    }
}

/// An argument that does not satisfy the schema: which field and why, for the model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Violation {
    pub(crate) field: String,
    pub(crate) message: String,
}

/// Drops top-level `null` values of optional fields: models often send `"type": null` for "not given".
pub(crate) fn normalize(schema: &Value, args: &mut Value) {
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    if let Value::Object(o) = args {
        o.retain(|k, v| !v.is_null() || required.contains(&k.as_str()));
    }
}

/// Checks `value` against the subset of JSON Schema the generated schemas use.
pub(crate) fn validate(schema: &Value, value: &Value) -> Result<(), Violation> {
    check(schema, value, "")
}

fn violation(path: &str, message: impl Into<String>) -> Violation {
    Violation {
        field: if path.is_empty() {
            "(arguments)".into()
        } else {
            path.to_owned()
        },
        message: message.into(),
    }
}

fn type_matches(t: &str, v: &Value) -> bool {
    match t {
        "object" => v.is_object(),
        "array" => v.is_array(),
        "string" => v.is_string(),
        "boolean" => v.is_boolean(),
        "null" => v.is_null(),
        "number" => v.is_number(),
        "integer" => v.is_i64() || v.is_u64(),
        _ => true,
    }
}

fn check(schema: &Value, v: &Value, path: &str) -> Result<(), Violation> {
    let Value::Object(s) = schema else {
        return Ok(());
    };
    if let Some(t) = s.get("type") {
        let ok = match t {
            Value::String(t) => type_matches(t, v),
            Value::Array(ts) => ts
                .iter()
                .filter_map(Value::as_str)
                .any(|t| type_matches(t, v)),
            _ => true,
        };
        if !ok {
            return Err(violation(path, format!("must be of type {t}")));
        }
    }
    if let Some(Value::Array(allowed)) = s.get("enum")
        && !allowed.contains(v)
    {
        let names: Vec<String> = allowed.iter().map(Value::to_string).collect();
        return Err(violation(
            path,
            format!("must be one of {}", names.join(", ")),
        ));
    }
    if let Some(c) = s.get("const")
        && c != v
    {
        return Err(violation(path, format!("must be {c}")));
    }
    for key in ["anyOf", "oneOf"] {
        if let Some(Value::Array(alts)) = s.get(key) {
            let mut first_err = None;
            if !alts.iter().any(|a| match check(a, v, path) {
                Ok(()) => true,
                Err(e) => {
                    first_err.get_or_insert(e);
                    false
                }
            }) {
                return Err(first_err.unwrap_or_else(|| violation(path, "is not allowed")));
            }
        }
    }
    match v {
        Value::String(text) => check_string(s, text, path),
        Value::Number(n) => n.as_f64().map_or(Ok(()), |x| check_number(s, x, path)),
        Value::Array(items) => check_array(s, items, path),
        Value::Object(fields) => check_object(s, fields, path),
        _ => Ok(()),
    }
}

type Schema = serde_json::Map<String, Value>;

/// A string's length and pattern.
fn check_string(s: &Schema, text: &str, path: &str) -> Result<(), Violation> {
    let n = text.chars().count() as u64;
    if let Some(min) = s.get("minLength").and_then(Value::as_u64)
        && n < min
    {
        return Err(violation(
            path,
            format!("must be at least {min} characters"),
        ));
    }
    if let Some(max) = s.get("maxLength").and_then(Value::as_u64)
        && n > max
    {
        return Err(violation(path, format!("must be at most {max} characters")));
    }
    if let Some(p) = s.get("pattern").and_then(Value::as_str) {
        match pattern_matches(p, text) {
            Some(true) => {}
            Some(false) => return Err(violation(path, format!("must match the pattern {p}"))),
            None => return Err(violation(path, "has an unusable pattern")),
        }
    }
    Ok(())
}

/// A number's bounds.
fn check_number(s: &Schema, x: f64, path: &str) -> Result<(), Violation> {
    if let Some(min) = s.get("minimum").and_then(Value::as_f64)
        && x < min
    {
        return Err(violation(path, format!("must be at least {min}")));
    }
    if let Some(max) = s.get("maximum").and_then(Value::as_f64)
        && x > max
    {
        return Err(violation(path, format!("must be at most {max}")));
    }
    Ok(())
}

/// An array's length and items.
fn check_array(s: &Schema, items: &[Value], path: &str) -> Result<(), Violation> {
    if let Some(min) = s.get("minItems").and_then(Value::as_u64)
        && (items.len() as u64) < min
    {
        return Err(violation(path, format!("must have at least {min} items")));
    }
    if let Some(max) = s.get("maxItems").and_then(Value::as_u64)
        && items.len() as u64 > max
    {
        return Err(violation(path, format!("must have at most {max} items")));
    }
    if let Some(item_schema) = s.get("items") {
        for (i, item) in items.iter().enumerate() {
            check(item_schema, item, &format!("{path}[{i}]"))?;
        }
    }
    Ok(())
}

/// An object's required and accepted fields.
fn check_object(s: &Schema, fields: &Schema, path: &str) -> Result<(), Violation> {
    let props = s.get("properties").and_then(Value::as_object);
    if let Some(Value::Array(required)) = s.get("required") {
        for r in required.iter().filter_map(Value::as_str) {
            if !fields.contains_key(r) {
                return Err(violation(&join(path, r), "is required"));
            }
        }
    }
    for (k, fv) in fields {
        match props.and_then(|p| p.get(k)) {
            Some(ps) => check(ps, fv, &join(path, k))?,
            None if s.get("additionalProperties") == Some(&Value::Bool(false)) => {
                return Err(violation(&join(path, k), "is not an accepted argument"));
            }
            None => {}
        }
    }
    Ok(())
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_owned()
    } else {
        format!("{path}.{key}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[derive(serde::Deserialize, JsonSchema)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Demo {
        #[schemars(length(min = 1, max = 5))]
        name: String,
        #[serde(default)]
        #[schemars(range(min = 1, max = 20))]
        limit: Option<u32>,
        #[serde(default)]
        #[schemars(length(max = 2), inner(length(min = 1)))]
        tags: Vec<String>,
    }

    #[test]
    fn patterns_are_compiled_once_and_still_checked() {
        for _ in 0..3 {
            assert_eq!(pattern_matches(r"\S", "kickflip"), Some(true));
            assert_eq!(pattern_matches(r"\S", "   "), Some(false));
            assert_eq!(pattern_matches("(unclosed", "x"), None);
        }
        let cache = PATTERNS.lock().unwrap();
        assert!(cache.contains_key(r"\S") && cache.contains_key("(unclosed"));
    }

    #[test]
    fn schema_and_validation_agree() {
        let s = parameters_for::<Demo>();
        assert_eq!(s["properties"]["limit"]["type"], "integer");
        assert_eq!(s["properties"]["limit"]["maximum"], 20);
        assert_eq!(s["additionalProperties"], false);
        assert!(validate(&s, &json!({"name": "abc", "limit": 3})).is_ok());
        let e = validate(&s, &json!({"name": "", "limit": 3})).unwrap_err();
        assert_eq!(e.field, "name");
        let e = validate(&s, &json!({"name": "a", "limit": 21})).unwrap_err();
        assert_eq!(e.field, "limit");
        let e = validate(&s, &json!({"name": "a", "tags": ["x", ""]})).unwrap_err();
        assert_eq!(e.field, "tags[1]");
        let e = validate(&s, &json!({"name": "a", "userId": "x"})).unwrap_err();
        assert_eq!(e.field, "userId");
        let e = validate(&s, &json!({})).unwrap_err();
        assert_eq!(e.field, "name");
        let mut v = json!({"name": "a", "limit": null});
        normalize(&s, &mut v);
        assert!(validate(&s, &v).is_ok());
    }
}
