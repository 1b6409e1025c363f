//! JSON Schemas of tool arguments, generated from the `Args` types, and their validation.
//!
//! One schema serves both ends: an [`ArgsSchema`] holds the value the model is shown in `tools` and the
//! `jsonschema` validator compiled from that very value, so the limits written once in
//! `#[schemars(length(..), range(..), regex(..))]` can never drift apart. What fails is said in the
//! model's terms ([`Violation`]): the field's path and what it must be.

use std::sync::Arc;

use jsonschema::{PatternOptions, ValidationError, Validator, error::ValidationErrorKind as Kind};
use schemars::{JsonSchema, generate::SchemaSettings};
use serde_json::{Map, Value};

/// A tool's argument schema: the value its definition shows the model, and the validator compiled from it.
pub(crate) struct ArgsSchema {
    value: Arc<Value>,
    validator: Validator,
}

impl ArgsSchema {
    /// The schema of arguments of type `T` ([`parameters_for`]).
    pub(crate) fn of<T: JsonSchema>() -> Self {
        Self::compile(parameters_for::<T>()).expect(
            "a schema generated from an Args type compiles: the registry's test builds each",
        )
    }

    /// The schema `value`, compiled (draft 7; patterns by the `regex` crate, linear in the text).
    pub(crate) fn compile(value: Value) -> Result<Self, String> {
        let validator = jsonschema::draft7::options()
            .with_pattern_options(PatternOptions::regex())
            .build(&value)
            .map_err(|e| e.to_string())?;
        Ok(Self {
            value: Arc::new(value),
            validator,
        })
    }

    /// The schema as the model is shown it.
    pub(crate) fn value(&self) -> &Arc<Value> {
        &self.value
    }

    /// Checks `args` against the schema. The violation reported is the first one, unless another names
    /// an argument no tool accepts; up to three more are named in its message, so the model can mend
    /// them all in one try.
    pub(crate) fn validate(&self, args: &Value) -> Result<(), Violation> {
        let mut found: Vec<Violation> = self
            .validator
            .iter_errors(args)
            .take(MAX_REPORTED)
            .map(|e| violation_of(&e))
            .collect();
        if found.is_empty() {
            return Ok(());
        }
        if let Some(i) = found.iter().position(|v| v.unexpected) {
            found.swap(0, i);
        }
        let mut first = found.remove(0);
        if !found.is_empty() {
            let also: Vec<String> = found
                .iter()
                .map(|v| format!("`{}` {}", v.field, v.message))
                .collect();
            first.message = format!("{} (also: {})", first.message, also.join("; "));
        }
        Err(first)
    }
}

/// Violations read from one validation, at most.
const MAX_REPORTED: usize = 4;

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
    /// The field is one the schema does not accept at all.
    pub(crate) unexpected: bool,
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

/// One validation error in the model's terms: the field's path (`tags[1]`, `slots.when`) and what it
/// must be.
fn violation_of(e: &ValidationError<'_>) -> Violation {
    let path = field_path(e);
    let at = |field: String, message: String, unexpected: bool| Violation {
        field: if field.is_empty() {
            "(arguments)".into()
        } else {
            field
        },
        message,
        unexpected,
    };
    let message = match e.kind() {
        Kind::Required { property } => {
            let name = property.as_str().unwrap_or_default();
            return at(join(&path, name), "is required".into(), false);
        }
        Kind::AdditionalProperties { unexpected } => {
            let name = unexpected.first().map(String::as_str).unwrap_or_default();
            return at(
                join(&path, name),
                "is not an accepted argument".into(),
                true,
            );
        }
        Kind::AnyOf { context } | Kind::OneOfNotValid { context } => {
            match context.iter().flatten().next() {
                Some(inner) => return violation_of(inner),
                None => "is not allowed".into(),
            }
        }
        Kind::Type { kind } => match kind {
            jsonschema::error::TypeKind::Single(t) => format!("must be of type {t}"),
            jsonschema::error::TypeKind::Multiple(_) => e.to_string(),
        },
        Kind::Enum { options } => match options.as_array() {
            Some(values) => {
                let names: Vec<String> = values.iter().map(Value::to_string).collect();
                format!("must be one of {}", names.join(", "))
            }
            None => e.to_string(),
        },
        Kind::Constant { expected_value } => format!("must be {expected_value}"),
        Kind::MinLength { limit } => format!("must be at least {limit} characters"),
        Kind::MaxLength { limit } => format!("must be at most {limit} characters"),
        Kind::Pattern { pattern } => format!("must match the pattern {pattern}"),
        Kind::Minimum { limit } => format!("must be at least {limit}"),
        Kind::Maximum { limit } => format!("must be at most {limit}"),
        Kind::MinItems { limit } => format!("must have at least {limit} items"),
        Kind::MaxItems { limit } => format!("must have at most {limit} items"),
        _ => e.to_string(),
    };
    at(path, message, false)
}

/// The error's instance location as a field path: `tags[1]`, `slots.when`; empty at the root.
fn field_path(e: &ValidationError<'_>) -> String {
    let mut path = String::new();
    for segment in e.instance_path().segments() {
        match segment {
            jsonschema::paths::LocationSegment::Index(i) => path.push_str(&format!("[{i}]")),
            jsonschema::paths::LocationSegment::Property(name) => path = join(&path, &name),
        }
    }
    path
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
    fn schema_and_validation_agree() {
        let schema = ArgsSchema::of::<Demo>();
        let s = schema.value();
        assert_eq!(s["properties"]["limit"]["type"], "integer");
        assert_eq!(s["properties"]["limit"]["maximum"], 20);
        assert_eq!(s["additionalProperties"], false);
        let check = |v: Value| schema.validate(&v);
        assert!(check(json!({"name": "abc", "limit": 3})).is_ok());
        let e = check(json!({"name": "", "limit": 3})).unwrap_err();
        assert_eq!(
            (e.field.as_str(), e.message.as_str()),
            ("name", "must be at least 1 characters")
        );
        let e = check(json!({"name": "a", "limit": 21})).unwrap_err();
        assert_eq!(
            (e.field.as_str(), e.message.as_str()),
            ("limit", "must be at most 20")
        );
        let e = check(json!({"name": "a", "tags": ["x", ""]})).unwrap_err();
        assert_eq!(e.field, "tags[1]");
        let e = check(json!({"name": "a", "tags": ["x", "y", "z"]})).unwrap_err();
        assert_eq!(
            (e.field.as_str(), e.message.as_str()),
            ("tags", "must have at most 2 items")
        );
        let e = check(json!({"name": "a", "userId": "x"})).unwrap_err();
        assert_eq!((e.field.as_str(), e.unexpected), ("userId", true));
        let e = check(json!({})).unwrap_err();
        assert_eq!(
            (e.field.as_str(), e.message.as_str()),
            ("name", "is required")
        );
        let e = check(json!({"name": 7})).unwrap_err();
        assert_eq!(
            (e.field.as_str(), e.message.as_str()),
            ("name", "must be of type string")
        );
        let mut v = json!({"name": "a", "limit": null});
        normalize(s, &mut v);
        assert!(check(v).is_ok());
    }

    #[test]
    fn an_unaccepted_argument_is_reported_first_and_the_others_are_named_too() {
        let schema = ArgsSchema::of::<Demo>();
        let e = schema
            .validate(&json!({"name": "", "limit": 99, "ownerId": "x"}))
            .unwrap_err();
        assert_eq!(e.field, "ownerId");
        assert!(
            e.message.starts_with("is not an accepted argument (also: "),
            "{}",
            e.message
        );
        assert!(
            e.message.contains("`name` must be at least 1 characters"),
            "{}",
            e.message
        );
        assert!(
            e.message.contains("`limit` must be at most 20"),
            "{}",
            e.message
        );
    }

    #[test]
    fn patterns_and_enums_say_what_is_allowed() {
        let schema = ArgsSchema::compile(json!({
            "type": "object",
            "properties": {
                "id": {"type": "string", "pattern": "^[0-9a-f]{24}$"},
                "kind": {"type": "string", "enum": ["park", "street"]},
            },
            "additionalProperties": false,
        }))
        .unwrap();
        let e = schema.validate(&json!({"id": "nope"})).unwrap_err();
        assert_eq!(e.message, "must match the pattern ^[0-9a-f]{24}$");
        let e = schema.validate(&json!({"kind": "mall"})).unwrap_err();
        assert_eq!(
            (e.field.as_str(), e.message.as_str()),
            ("kind", r#"must be one of "park", "street""#)
        );
        assert!(ArgsSchema::compile(json!({"type": "string", "pattern": "(unclosed"})).is_err());
    }
}
