//! The environment that gives a child process (a worker the bench or a test starts) exactly a
//! configuration: every setting, under the name the `companion` binary reads it from.
//!
//! Nothing here names a setting. A section of the configuration (`crates/core/src/config.rs`) is a
//! `clap::Args` whose fields each have an `env = "…"`, and, with the `testing` feature, a
//! `serde::Serialize`. Both derives take a struct's fields in the order they are declared (a flattened
//! section in its place), so a section's n-th argument and its n-th serialized value are the same
//! setting: [`of`] pairs them by position, the name from the argument and the value from the field.
//! It checks that there are as many of each, and the test below, in which every setting has a value
//! of its own, checks that each value lands under its own name and that it all reads back whole.
//!
//! Why not something else:
//! - a list of the settings by hand (what this module was): a second edit for every new setting, and
//!   one forgotten there was silently lost on the way to the child;
//! - the `ArgMatches` of the parse: the bench and the tests change a configuration after parsing it;
//! - pairing by name: clap's ids (`nats-url`) are not the field names (`url`), which repeat across
//!   sections, and serde renames on every field would be the second edit again.
//!
//! `Secret` has no `Serialize` (`secrecy` withholds it); the sections serialize theirs exposed, with the
//! `testing` feature only. The values go to `Command::envs`, never to a log.

use std::{ffi::OsStr, fmt};

use clap::{Args, Command};
use companion_core::config::Config;
use serde::{
    Serialize,
    ser::{self, Impossible},
};

/// `name=value` pairs for a child process's environment.
pub type Env = Vec<(String, String)>;

/// Every setting of `c` as the environment a `companion` process reads, so that it parses back exactly
/// `c`. An optional setting that is unset is left out.
pub fn of(c: &Config) -> Env {
    let mut env = section(c);
    // Parsed once for every subcommand (global flags), so not one of `Config`'s arguments.
    env.extend(section(&c.log));
    env
}

/// The settings of one section: the name from each argument, the value from the field in its place.
fn section<T: Args + Serialize>(section: &T) -> Env {
    let command = T::augment_args(Command::new("companion"));
    let mut values = Values::default();
    if let Err(Unsupported(what)) = section.serialize(&mut values) {
        panic!("{}: {what}", std::any::type_name::<T>());
    }
    let args: Vec<_> = command.get_arguments().collect();
    assert_eq!(
        args.len(),
        values.0.len(),
        "{}: as many arguments as serialized fields (a field skipped by one derive is skipped by both)",
        std::any::type_name::<T>()
    );
    let mut env = Env::new();
    for (arg, value) in args.into_iter().zip(values.0) {
        let name = arg.get_env().and_then(OsStr::to_str);
        let name = name.unwrap_or_else(|| panic!("--{} has no environment name", arg.get_id()));
        let value = match value {
            Value::Unset => continue,
            Value::One(v) => v,
            // Clap reads an empty variable as one empty item: an empty list is left out, which only
            // reads back as empty without a default.
            Value::Many(vs) if vs.is_empty() => {
                let default = arg.get_default_values();
                assert!(
                    default.is_empty(),
                    "{name}: an empty list that reads back as its default"
                );
                continue;
            }
            Value::Many(vs) => {
                let delimiter = arg.get_value_delimiter();
                let delimiter =
                    delimiter.unwrap_or_else(|| panic!("{name}: a list without a delimiter"));
                vs.join(delimiter.encode_utf8(&mut [0; 4]))
            }
        };
        env.push((name.to_owned(), value));
    }
    env
}

/// One field's value, as text clap reads back.
enum Value {
    Unset,
    One(String),
    Many(Vec<String>),
}

/// The values of a section's fields in order, nested sections walked through: a `serde::Serializer`.
#[derive(Default)]
struct Values(Vec<Value>);

/// A shape no setting has.
#[derive(Debug)]
struct Unsupported(String);

impl fmt::Display for Unsupported {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Unsupported {}

impl ser::Error for Unsupported {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        Self(msg.to_string())
    }
}

fn unsupported<T>(what: &str) -> Result<T, Unsupported> {
    Err(Unsupported(format!("a setting cannot be {what}")))
}

/// Values written as `Display` writes them (the shortest text that reads back the same number).
macro_rules! displayed {
    ($($method:ident: $t:ty),*) => {$(
        fn $method(self, v: $t) -> Result<(), Unsupported> {
            self.0.push(Value::One(v.to_string()));
            Ok(())
        }
    )*};
}

impl<'a> ser::Serializer for &'a mut Values {
    type Ok = ();
    type Error = Unsupported;
    type SerializeSeq = Many<'a>;
    type SerializeTuple = Impossible<(), Unsupported>;
    type SerializeTupleStruct = Impossible<(), Unsupported>;
    type SerializeTupleVariant = Impossible<(), Unsupported>;
    type SerializeMap = Impossible<(), Unsupported>;
    type SerializeStruct = Self;
    type SerializeStructVariant = Impossible<(), Unsupported>;

    displayed!(
        serialize_bool: bool, serialize_char: char, serialize_str: &str,
        serialize_i8: i8, serialize_i16: i16, serialize_i32: i32, serialize_i64: i64,
        serialize_u8: u8, serialize_u16: u16, serialize_u32: u32, serialize_u64: u64,
        serialize_f32: f32, serialize_f64: f64
    );

    fn serialize_none(self) -> Result<(), Unsupported> {
        self.0.push(Value::Unset);
        Ok(())
    }

    fn serialize_some<T: ?Sized + Serialize>(self, v: &T) -> Result<(), Unsupported> {
        v.serialize(self)
    }

    /// A `clap::ValueEnum`, whose serde name is its clap name (`rename_all = "kebab-case"`).
    fn serialize_unit_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
    ) -> Result<(), Unsupported> {
        self.0.push(Value::One(variant.to_owned()));
        Ok(())
    }

    fn serialize_newtype_struct<T: ?Sized + Serialize>(
        self,
        _: &'static str,
        v: &T,
    ) -> Result<(), Unsupported> {
        v.serialize(self)
    }

    fn serialize_seq(self, _: Option<usize>) -> Result<Many<'a>, Unsupported> {
        Ok(Many(self, Vec::new()))
    }

    fn serialize_struct(self, _: &'static str, _: usize) -> Result<Self, Unsupported> {
        Ok(self)
    }

    fn serialize_bytes(self, _: &[u8]) -> Result<(), Unsupported> {
        unsupported("bytes")
    }

    fn serialize_unit(self) -> Result<(), Unsupported> {
        unsupported("()")
    }

    fn serialize_unit_struct(self, name: &'static str) -> Result<(), Unsupported> {
        unsupported(name)
    }

    fn serialize_newtype_variant<T: ?Sized + Serialize>(
        self,
        name: &'static str,
        _: u32,
        _: &'static str,
        _: &T,
    ) -> Result<(), Unsupported> {
        unsupported(name)
    }

    fn serialize_tuple(self, _: usize) -> Result<Self::SerializeTuple, Unsupported> {
        unsupported("a tuple")
    }

    fn serialize_tuple_struct(
        self,
        name: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleStruct, Unsupported> {
        unsupported(name)
    }

    fn serialize_tuple_variant(
        self,
        name: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleVariant, Unsupported> {
        unsupported(name)
    }

    fn serialize_map(self, _: Option<usize>) -> Result<Self::SerializeMap, Unsupported> {
        unsupported("a map")
    }

    fn serialize_struct_variant(
        self,
        name: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeStructVariant, Unsupported> {
        unsupported(name)
    }
}

impl ser::SerializeStruct for &mut Values {
    type Ok = ();
    type Error = Unsupported;

    fn serialize_field<T: ?Sized + Serialize>(
        &mut self,
        _: &'static str,
        v: &T,
    ) -> Result<(), Unsupported> {
        v.serialize(&mut **self)
    }

    fn end(self) -> Result<(), Unsupported> {
        Ok(())
    }
}

/// A list setting (`value_delimiter`), its items each a single value.
struct Many<'a>(&'a mut Values, Vec<String>);

impl ser::SerializeSeq for Many<'_> {
    type Ok = ();
    type Error = Unsupported;

    fn serialize_element<T: ?Sized + Serialize>(&mut self, v: &T) -> Result<(), Unsupported> {
        let mut item = Values::default();
        v.serialize(&mut item)?;
        match item.0.as_mut_slice() {
            [Value::One(v)] => self.1.push(std::mem::take(v)),
            _ => return unsupported("a list of lists or of optional values"),
        }
        Ok(())
    }

    fn end(self) -> Result<(), Unsupported> {
        self.0.0.push(Value::Many(self.1));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{Arg, CommandFactory, Parser};
    use companion_core::config::LogConfig;

    /// The settings as the `companion` binary takes them: the worker's sections and the global ones.
    #[derive(Parser)]
    struct Child {
        #[command(flatten)]
        config: Config,
        #[command(flatten)]
        log: LogConfig,
    }

    /// Parses `env` as the binary does. Each variable is given as its argument's flag, which clap reads
    /// as it reads the variable (one value, split at the delimiter), without touching this process's
    /// environment.
    fn parse(env: &[(String, String)]) -> Config {
        let command = Child::command();
        let mut args = vec!["companion".to_owned()];
        for (name, value) in env {
            let arg = command
                .get_arguments()
                .find(|a| a.get_env() == Some(name.as_ref()));
            let arg = arg.unwrap_or_else(|| panic!("{name} is no setting"));
            args.push(format!("--{}={value}", arg.get_long().unwrap()));
        }
        let child = Child::try_parse_from(args).unwrap();
        Config {
            log: child.log,
            ..child.config
        }
    }

    /// A value that `arg` accepts and that is no other setting's and not its default: one of its
    /// choices, else the first of a number, a decimal, a time of day, a boolean that it parses.
    fn value_of_its_own(i: usize, arg: &Arg) -> String {
        let n = 10 + i;
        let choices = arg.get_possible_values().into_iter();
        let choices = choices
            .filter(|p| !p.is_hide_set())
            .map(|p| p.get_name().to_owned());
        let candidates = [
            format!("{n}"),
            format!("{n}.5"),
            format!("{:02}:{:02}:30", n % 24, n % 60),
        ];
        let booleans = ["true", "false"].map(str::to_owned);
        let parses = |v: &String| {
            let probe = Arg::new("v")
                .long("v")
                .value_parser(arg.get_value_parser().clone());
            let probe = Command::new("probe").arg(probe);
            probe
                .try_get_matches_from(["probe", &format!("--v={v}")])
                .is_ok()
        };
        let default = arg.get_default_values();
        choices
            .chain(candidates)
            .chain(booleans)
            .filter(|v| !default.iter().any(|d| d == v.as_str()))
            .find(parses)
            .unwrap_or_else(|| panic!("no value for --{}", arg.get_id()))
    }

    /// Every setting, each with a value of its own, lands under its own name, and reads back whole.
    #[test]
    fn every_setting_reaches_the_child_under_its_own_name() {
        let command = Child::command();
        let mut given: Env = command
            .get_arguments()
            .enumerate()
            .map(|(i, arg)| {
                let name = arg.get_env().and_then(OsStr::to_str);
                let name = name.unwrap_or_else(|| panic!("--{} has no env", arg.get_id()));
                (name.to_owned(), value_of_its_own(i, arg))
            })
            .collect();
        let config = parse(&given);
        let mut env = of(&config);
        given.sort();
        env.sort();
        // Compared without printing a value: some are secrets.
        let names = |e: &Env| e.iter().map(|(k, _)| k.clone()).collect::<Vec<_>>();
        assert_eq!(names(&env), names(&given), "the same settings");
        for ((name, value), (_, expected)) in env.iter().zip(&given) {
            assert!(value == expected, "{name}: not the value given");
        }
        assert_eq!(format!("{:?}", parse(&env)), format!("{config:?}"));
    }

    /// The defaults (unset optional settings, an empty list, empty secrets) read back as they are.
    #[test]
    fn the_defaults_read_back_as_they_are() {
        let config = Config::from_env().unwrap();
        let env = of(&config);
        let back = parse(&env);
        assert_eq!(format!("{back:?}"), format!("{config:?}"));
        assert!(
            of(&back) == env,
            "the same environment (not printed: secrets)"
        );
    }
}
