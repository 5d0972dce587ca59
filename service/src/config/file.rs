//! The TOML file named by `KEYTURN_CONFIG`, as defaults below the
//! environment and the command line.

use std::ffi::OsString;
use std::path::Path;

use clap::Parser;

use super::upstreams::UPSTREAM_KEY;
use crate::error::Error;

/// Parses `P` (the `Config` itself or a CLI that flattens it) from `args`
/// and the environment, using the TOML file at `file` (if any) as defaults.
///
/// Clap errors (including `--help`) come back as `Err(clap::Error)` so the
/// caller can `exit()` with clap's formatting; file errors as
/// [`Error::Config`].
pub fn parse_with_file<P: Parser>(
    args: impl IntoIterator<Item = impl Into<OsString> + Clone>,
    file: Option<&Path>,
) -> Result<Result<P, clap::Error>, Error> {
    let cmd = command_with_file_defaults(P::command(), file)?;
    let matches = match cmd.try_get_matches_from(args) {
        Ok(m) => m,
        Err(e) => return Ok(Err(e)),
    };
    Ok(P::from_arg_matches(&matches))
}

/// Applies the TOML file at `file` (if any) to `cmd` as defaults.
pub(super) fn command_with_file_defaults(
    mut cmd: clap::Command,
    file: Option<&Path>,
) -> Result<clap::Command, Error> {
    if let Some(path) = file {
        for (key, value) in read_toml_defaults(path)? {
            if !cmd.get_arguments().any(|a| a.get_id() == key.as_str()) {
                return Err(Error::Config(format!(
                    "{}: unknown key `{key}` (keys are the long option names with `_`, e.g. `lease_seconds`)",
                    path.display()
                )));
            }
            // A default from the file must satisfy `required`, and it stays
            // below the environment and the command line in clap's order.
            cmd = cmd.mut_arg(key.as_str(), |a| a.default_value(value).required(false));
        }
    }
    Ok(cmd)
}

/// Reads the TOML file into `(key, value-as-text)` pairs. Only flat scalar
/// values are accepted: each one becomes the default of the option of the
/// same name.
fn read_toml_defaults(path: &Path) -> Result<Vec<(String, String)>, Error> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::Config(format!("cannot read {}: {e}", path.display())))?;
    let table: toml::Table = text
        .parse()
        .map_err(|e| Error::Config(format!("{} is not valid TOML: {e}", path.display())))?;
    let mut out = Vec::with_capacity(table.len());
    for (key, value) in table {
        if key == UPSTREAM_KEY {
            // Tables, read by read_upstreams.
            continue;
        }
        let text = match value {
            toml::Value::String(s) => s,
            toml::Value::Integer(i) => i.to_string(),
            toml::Value::Float(f) => f.to_string(),
            toml::Value::Boolean(b) => b.to_string(),
            _ => {
                return Err(Error::Config(format!(
                    "{}: `{key}` must be a string, number or boolean",
                    path.display()
                )))
            }
        };
        out.push((key, text));
    }
    Ok(out)
}
