//! Which `pg_keyturn` this keyturnd serves against. Both ship from one
//! workspace under one version, and a release may change any dispatcher
//! function; patch releases change none. So serving starts only once the
//! database answers with a `pg_keyturn` of keyturnd's own major.minor, and
//! refuses (the process exits non-zero) a different one or none at all,
//! instead of failing on every call later. A database that does not answer
//! yet is waited for, as everywhere else.

use std::time::Duration;

use deadpool_postgres::Pool;
use tokio_util::sync::CancellationToken;

use crate::db;
use crate::error::Error;

/// This build's version, which is the extension version it speaks.
pub const OWN_VERSION: &str = env!("CARGO_PKG_VERSION");

const RETRY_MIN: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(5);

/// `Ok` when `installed` (`pg_extension.extversion`, `None` when the
/// extension is not installed) has the same major.minor as `own`.
pub fn check(installed: Option<&str>, own: &str) -> Result<(), Error> {
    let refuse = |why: String| Err(Error::Incompatible(why));
    let Some(installed) = installed else {
        return refuse(format!(
            "pg_keyturn is not installed in this database (keyturnd {own} needs pg_keyturn {}.x): \
             check DATABASE_URL, or CREATE EXTENSION pg_keyturn",
            major_minor(own).unwrap_or_else(|| own.to_owned())
        ));
    };
    match (major_minor(installed), major_minor(own)) {
        (Some(theirs), Some(ours)) if theirs == ours => Ok(()),
        _ => refuse(format!(
            "pg_keyturn {installed} is installed but keyturnd {own} speaks only pg_keyturn {}.x: \
             run the keyturnd of the extension's release, or ALTER EXTENSION pg_keyturn UPDATE",
            major_minor(own).unwrap_or_else(|| own.to_owned())
        )),
    }
}

/// `"1.2"` of `"1.2.3"` (or of `"1.2.3-rc.1"`); `None` for anything that is
/// not a semantic version.
fn major_minor(version: &str) -> Option<String> {
    let v = semver::Version::parse(version).ok()?;
    Some(format!("{}.{}", v.major, v.minor))
}

/// Asks the database for its `pg_keyturn` version until it answers, then
/// [`check`]s it. `Ok(false)`: shutdown came first.
pub async fn wait_for_compatible_extension(
    pool: &Pool,
    shutdown: &CancellationToken,
) -> Result<bool, Error> {
    let mut backoff = RETRY_MIN;
    let mut logged = false;
    loop {
        let asked = tokio::select! {
            _ = shutdown.cancelled() => return Ok(false),
            asked = async {
                let client = pool.get().await?;
                db::extension_version(&client).await
            } => asked,
        };
        match asked {
            Ok(installed) => {
                check(installed.as_deref(), OWN_VERSION)?;
                tracing::info!(
                    pg_keyturn = installed.as_deref().unwrap_or(""),
                    "database extension is compatible"
                );
                return Ok(true);
            }
            Err(e) if logged => {
                tracing::debug!(error = %e, "database still unavailable");
            }
            Err(e) => {
                logged = true;
                tracing::warn!(error = %e, "database unavailable; waiting for it before dispatching");
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => return Ok(false),
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(RETRY_MAX);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_same_major_minor_is_compatible() {
        assert!(check(Some("0.1.0"), "0.1.0").is_ok());
        assert!(check(Some("0.1.7"), "0.1.2").is_ok(), "patch releases");
        assert!(check(Some("1.4.0-rc.1"), "1.4.2").is_ok());
    }

    #[test]
    fn test_anything_else_is_refused_with_what_to_do() {
        for (installed, own) in [
            (Some("0.2.0"), "0.1.0"),
            (Some("1.1.0"), "0.1.0"),
            (Some("0.1"), "0.1.0"),
            (Some("banana"), "0.1.0"),
        ] {
            let err = check(installed, own).expect_err("refused").to_string();
            assert!(
                err.contains("ALTER EXTENSION pg_keyturn UPDATE"),
                "{installed:?}: {err}"
            );
        }
        let err = check(None, "0.1.0").expect_err("refused").to_string();
        assert!(
            err.contains("not installed") && err.contains("0.1.x"),
            "{err}"
        );
    }
}
