use super::file::command_with_file_defaults;
use super::keys::SECRET_BASE64;
use super::*;
use base64::Engine;
use clap::{CommandFactory, FromArgMatches};
use std::io::Write;

fn parse(args: &[&str], file: Option<&Path>) -> Result<Config, String> {
    let mut all = vec!["keyturnd"];
    all.extend_from_slice(args);
    // The test process may run with DATABASE_URL & co. set (CI does):
    // strip every `env` so only the arguments and the file count.
    let mut cmd = Config::command();
    let ids: Vec<String> = cmd
        .get_arguments()
        .map(|a| a.get_id().to_string())
        .collect();
    for id in ids {
        cmd = cmd.mut_arg(id, |a| a.env(None));
    }
    let cmd = command_with_file_defaults(cmd, file).map_err(|e| e.to_string())?;
    let matches = cmd.try_get_matches_from(all).map_err(|e| e.to_string())?;
    Config::from_arg_matches(&matches).map_err(|e| e.to_string())
}

fn toml_file(text: &str) -> tempfile::NamedTempFile {
    let mut f = tempfile::NamedTempFile::new().expect("temp file");
    f.write_all(text.as_bytes()).expect("write temp file");
    f
}

#[test]
fn test_standard_key_of_each_secret_form() {
    assert_eq!(
        webhook_key("s3cret-🔑").expect("any text"),
        "s3cret-🔑".as_bytes(),
        "no prefix: the UTF-8 bytes"
    );
    let padded = format!(
        "whsec_{}",
        base64::engine::general_purpose::STANDARD.encode(b"0123456789")
    );
    let unpadded = padded.trim_end_matches('=').to_owned();
    assert_ne!(padded, unpadded);
    for s in [padded, unpadded] {
        assert_eq!(webhook_key(&s).expect("decodes"), b"0123456789");
    }
    for rest in ["", "not base64!", "@@@@"] {
        let err = webhook_key(&format!("whsec_{rest}"))
            .expect_err("refused")
            .to_string();
        assert!(err.contains("KEYTURN_WEBHOOK_SECRET"), "{err}");
        assert!(rest.is_empty() || !err.contains(rest), "quoted: {err}");
    }
}

#[test]
fn test_frame_ancestors_accepts_sources_and_refuses_directives() {
    for ok in [
        "'none'",
        "'self'",
        "https://app.example.com 'self'",
        "https://*.example.com:8443",
    ] {
        let csp = csp_header(ok).expect(ok);
        assert!(csp.to_str().unwrap().starts_with("default-src 'self';"));
        assert!(csp
            .to_str()
            .unwrap()
            .ends_with(&format!("frame-ancestors {ok}")));
    }
    for bad in [
        "",
        "https://a; script-src *",
        "'none' 'self'",
        "'unsafe-inline'",
        "a,b",
        "x\u{0}y",
    ] {
        assert!(csp_header(bad).is_err(), "{bad:?}");
    }
    let folded = csp_header("https://a.example\r\nhttps://b.example").expect("valid");
    assert!(folded
        .to_str()
        .unwrap()
        .ends_with("frame-ancestors https://a.example https://b.example"));
}

/// One settings row of a docs table: its names, its default cell and
/// its meaning cell.
struct DocRow {
    file: &'static str,
    names: Vec<String>,
    default: String,
    meaning: String,
}

fn doc_rows() -> Vec<DocRow> {
    let mut rows = Vec::new();
    for file in ["keyturnd.md", "http.md"] {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../docs")
            .join(file);
        let text = std::fs::read_to_string(&path).expect("the docs are beside the crate");
        for line in text.lines() {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            // `| name | default | meaning |` splits into 5 cells.
            if cells.len() < 5 {
                continue;
            }
            let names: Vec<String> = cells[1]
                .split(", ")
                .map(|n| n.trim_matches('`').to_owned())
                .collect();
            let is_setting = |n: &String| {
                (n.starts_with("KEYTURN_") || n == "DATABASE_URL")
                    && n.chars().all(|c| c.is_ascii_uppercase() || c == '_')
            };
            if names.iter().all(is_setting) {
                rows.push(DocRow {
                    file,
                    names,
                    default: cells[2].trim_matches('`').to_owned(),
                    meaning: cells[3].to_owned(),
                });
            }
        }
    }
    rows
}

/// The range a docs row states: `(lo–hi` or `(at least lo`.
fn stated_range(meaning: &str) -> Option<(u64, Option<u64>)> {
    let number = |s: &str| -> Option<u64> {
        let digits: String = s.chars().take_while(char::is_ascii_digit).collect();
        digits.parse().ok()
    };
    for (i, _) in meaning.match_indices('(') {
        let rest = &meaning[i + 1..];
        if let Some(at_least) = rest.strip_prefix("at least ") {
            if let Some(lo) = number(at_least) {
                return Some((lo, None));
            }
        }
        if let Some(lo) = number(rest) {
            let after = &rest[lo.to_string().len()..];
            if let Some(hi) = after.strip_prefix('–').and_then(number) {
                return Some((lo, Some(hi)));
            }
        }
    }
    None
}

/// Whether clap takes `value` for the option of `id`.
fn takes(id: &str, value: &str) -> bool {
    let flag = format!("--{}", id.replace('_', "-"));
    let mut args = vec!["--database-url", "postgres://x"];
    if id != "database_url" {
        args.extend_from_slice(&[flag.as_str(), value]);
    }
    parse(&args, None).is_ok()
}

#[test]
fn test_the_docs_tables_say_what_clap_does() {
    let rows = doc_rows();
    let cmd = Config::command();
    let mut documented: Vec<String> = Vec::new();
    for arg in cmd.get_arguments() {
        let Some(env) = arg.get_env().and_then(|e| e.to_str()) else {
            continue;
        };
        let found: Vec<&DocRow> = rows
            .iter()
            .filter(|r| r.names.iter().any(|n| n == env))
            .collect();
        assert_eq!(
            found.len(),
            1,
            "{env} must have exactly one row in docs/keyturnd.md or docs/http.md"
        );
        let row = found[0];
        documented.push(env.to_owned());
        let id = arg.get_id().as_str();
        let defaults: Vec<String> = arg
            .get_default_values()
            .iter()
            .map(|v| v.to_string_lossy().into_owned())
            .collect();
        match defaults.as_slice() {
            [default] => assert_eq!(
                &row.default, default,
                "{env}'s default in docs/{}",
                row.file
            ),
            _ if arg.is_required_set() => assert!(
                row.default.starts_with("required"),
                "{env} is required; docs/{} says {:?}",
                row.file,
                row.default
            ),
            _ => assert!(
                row.default.parse::<f64>().is_err() && row.default != "true",
                "{env} has no default in clap; docs/{} gives one",
                row.file
            ),
        }
        // A number setting: its stated range is exactly what clap takes.
        let numeric = defaults.len() == 1 && defaults[0].parse::<u64>().is_ok();
        if !numeric {
            continue;
        }
        match stated_range(&row.meaning) {
            Some((lo, hi)) => {
                assert!(takes(id, &lo.to_string()), "{env} takes {lo}");
                if lo > 0 {
                    assert!(
                        !takes(id, &(lo - 1).to_string()),
                        "{env} refuses {}",
                        lo - 1
                    );
                }
                match hi {
                    Some(hi) => {
                        assert!(takes(id, &hi.to_string()), "{env} takes {hi}");
                        assert!(
                            !takes(id, &(hi + 1).to_string()),
                            "{env} refuses {}",
                            hi + 1
                        );
                    }
                    None => assert!(takes(id, "1000000"), "{env} has no upper bound"),
                }
            }
            None => assert!(
                takes(id, "0") && takes(id, "1000000"),
                "{env} has a range in clap that docs/{} does not state as (lo–hi) or (at least lo)",
                row.file
            ),
        }
    }
    for row in &rows {
        for name in &row.names {
            assert!(
                documented.contains(name) || name == "KEYTURN_CONFIG",
                "docs/{} documents {name}, which keyturnd does not read",
                row.file
            );
        }
    }
}

#[test]
fn test_defaults_match_the_contract() {
    let c = parse(&["--database-url", "postgres://x"], None).expect("parses");
    assert_eq!(c.listen.to_string(), "127.0.0.1:8787");
    assert_eq!(c.lease_seconds, 30);
    assert_eq!(c.sweep_seconds, 5);
    assert_eq!(c.workers, 8);
    assert_eq!(c.db_connections, 16);
    assert_eq!(c.poll_ms, 1000);
    assert_eq!(c.lease_linger_ms, 2);
    assert_eq!(c.lease_steps, 2);
    assert_eq!(c.mcp_refresh_seconds, 300);
    assert!(c.listen_notify);
    assert!(!c.rpc_enabled(), "/rpc is off by default");
    assert_eq!(c.frame_ancestors, "'none'");
    assert_eq!(
        c.listen_url().expose(),
        "postgres://x",
        "LISTEN on the pool's URL"
    );
    assert_eq!(c.notify_heartbeat(), Some(Duration::from_secs(10)));
    c.validate().expect("defaults are valid");
}

#[test]
fn test_listen_url_and_heartbeat_follow_their_settings() {
    let c = parse(
        &[
            "--database-url",
            "postgres://pooler:6432/db",
            "--listen-database-url",
            "postgres://direct:5432/db",
            "--notify-heartbeat-seconds",
            "0",
        ],
        None,
    )
    .expect("parses");
    c.validate().expect("valid");
    assert_eq!(c.listen_url().expose(), "postgres://direct:5432/db");
    assert_eq!(c.notify_heartbeat(), None, "0 turns the heartbeat off");
    let c = parse(
        &["--database-url", "postgres://x", "--listen-notify", "false"],
        None,
    )
    .expect("parses");
    assert_eq!(c.notify_heartbeat(), None, "no LISTEN, nothing to check");
}

#[test]
fn test_jwt_roles_are_a_comma_separated_list() {
    let c = parse(
        &[
            "--database-url",
            "postgres://x",
            "--jwt-secret",
            "0123456789abcdef0123456789abcdef",
            "--rpc-database-url",
            "postgres://auth@h/db",
            "--jwt-roles",
            "web_human,web_operator",
        ],
        None,
    )
    .expect("parses");
    assert_eq!(c.jwt_roles, ["web_human", "web_operator"]);
    assert!(c.rpc_enabled());
    c.validate().expect("valid");
    let dump = format!("{c:?}");
    assert!(!dump.contains("0123456789abcdef") && !dump.contains("auth@h"));
}

#[test]
fn test_file_fills_in_and_the_command_line_overrides_it() {
    let f = toml_file("database_url = \"postgres://file\"\nworkers = 3\nlisten_notify = false\n");
    let c = parse(&[], Some(f.path())).expect("file supplies database_url");
    assert_eq!(c.database_url.expose(), "postgres://file");
    assert_eq!(c.workers, 3);
    assert!(!c.listen_notify);
    let c = parse(&["--workers", "5"], Some(f.path())).expect("parses");
    assert_eq!(
        c.workers, 5,
        "the command line (like the environment) beats the file"
    );
}

#[test]
fn test_upstreams_are_read_from_the_file_with_env_headers() {
    std::env::set_var("KT_CONFIG_TEST_UPSTREAM_TOKEN", "Bearer s3cr3t-upstream");
    let f = toml_file(
        "database_url = \"postgres://x\"\n\
         [[mcp_upstream]]\nname = \"github\"\nurl = \"https://mcp.example.com/mcp\"\n\
         headers = { Authorization = \"env:KT_CONFIG_TEST_UPSTREAM_TOKEN\", X-Team = \"core\" }\n\
         trust_annotations = true\n\
         [[mcp_upstream]]\nname = \"Slack-eu\"\nurl = \"http://127.0.0.1:9/mcp\"\n",
    );
    let c = parse(&[], Some(f.path())).expect("the tables do not disturb the settings");
    assert_eq!(c.database_url.expose(), "postgres://x");
    let ups = read_upstreams(f.path()).expect("reads");
    assert_eq!(ups.len(), 2);
    assert_eq!(ups[0].name, "github");
    assert_eq!(ups[1].name, "Slack-eu");
    assert!(ups[0].trust_annotations && !ups[1].trust_annotations);
    assert_eq!(ups[0].headers[0].0, "Authorization");
    assert_eq!(ups[0].headers[0].1.expose(), "Bearer s3cr3t-upstream");
    assert!(
        !format!("{ups:?}").contains("s3cr3t"),
        "headers are secrets"
    );
    for (bad, needle) in [
        ("name = \"Git Hub\"\nurl = \"https://a/\"", "name must be"),
        ("name = \"1up\"\nurl = \"https://a/\"", "name must be"),
        ("name = \"a.b\"\nurl = \"https://a/\"", "name must be"),
        ("name = \"-a\"\nurl = \"https://a/\"", "name must be"),
        ("name = \"a23456789012345678901234567890x\"\nurl = \"https://a/\"", "name must be"),
        (
            "name = \"a\"\nurl = \"https://a/\"\n[[mcp_upstream]]\nname = \"A\"\nurl = \"https://b/\"",
            "two upstreams",
        ),
        ("name = \"a\"\nurl = \"ftp://a/\"", "url must be"),
        ("name = \"a\"\nurl = \"https://a/\"\nheaders = { A = \"env:KT_CONFIG_TEST_UNSET_VAR\" }", "KT_CONFIG_TEST_UNSET_VAR"),
        ("name = \"a\"\nurl = \"https://a/\"\ntrust = true", "takes name"),
    ] {
        let f = toml_file(&format!("[[mcp_upstream]]\n{bad}\n"));
        let err = read_upstreams(f.path()).expect_err(bad).to_string();
        assert!(err.contains(needle), "{bad}: {err}");
    }
}

#[test]
fn test_mcp_needs_a_jwt_key_and_a_login_of_its_own() {
    let key = [
        "--jwt-secret",
        "0123456789abcdef0123456789abcdef",
        "--rpc-database-url",
        "postgres://rpc@h/db",
        "--jwt-roles",
        "web_human",
    ];
    let with = |extra: &[&str]| {
        let mut args = vec!["--database-url", "postgres://disp@h/db"];
        args.extend_from_slice(extra);
        parse(&args, None)
            .expect("parses")
            .validate()
            .map(|_| ())
            .map_err(|e| e.to_string())
    };
    assert!(with(&["--mcp-roles", "agent_mcp"])
        .unwrap_err()
        .contains("JWT key"));
    let mut a = key.to_vec();
    a.extend_from_slice(&["--mcp-roles", "agent_mcp"]);
    assert!(with(&a)
        .unwrap_err()
        .contains("KEYTURN_MCP_DATABASE_URL is required"));
    let mut b = a.clone();
    b.extend_from_slice(&["--mcp-database-url", "postgres://rpc@h/db"]);
    assert!(with(&b).unwrap_err().contains("login of its own"));
    let mut c = a.clone();
    c.extend_from_slice(&["--mcp-database-url", "postgres://mcp@h/db"]);
    with(&c).expect("valid");
    // Off unless KEYTURN_MCP_ROLES names a role: the login alone, or
    // an empty list, leaves /mcp off (with a warning), not keyturnd.
    with(&["--mcp-database-url", "postgres://mcp@h/db"]).expect("off, not refused");
    with(&[
        "--mcp-roles",
        "",
        "--mcp-database-url",
        "postgres://mcp@h/db",
    ])
    .expect("an empty list is none");
    let off = parse(
        &[
            "--database-url",
            "postgres://disp@h/db",
            "--mcp-database-url",
            "postgres://mcp@h/db",
        ],
        None,
    )
    .expect("parses");
    assert!(!off.mcp_enabled());
    assert!(off.mcp_ignored().is_some());
    let mut d = key.to_vec();
    d.extend_from_slice(&[
        "--mcp-roles",
        "agent_mcp,",
        "--mcp-database-url",
        "postgres://mcp@h/db",
    ]);
    assert!(with(&d).unwrap_err().contains("none empty"));
}

#[test]
fn test_unknown_file_key_is_refused() {
    let f = toml_file("database_url = \"x\"\nworkerz = 3\n");
    let err = parse(&[], Some(f.path())).expect_err("typo must not pass");
    assert!(err.contains("workerz"), "{err}");
}

#[test]
fn test_secrets_never_show_in_debug() {
    let c = parse(
        &[
            "--database-url",
            "postgres://u:hunter2@h/db",
            "--webhook-url",
            "http://127.0.0.1:1/",
            "--webhook-secret",
            "s3cr3t-value",
            "--smtp-url",
            "smtp://user:pw-xyz@127.0.0.1:2525",
            "--smtp-from",
            "k@example.com",
            "--listen-database-url",
            "postgres://u:listen-pw@h/db",
        ],
        None,
    )
    .expect("parses");
    let dump = format!("{c:?}");
    for needle in ["hunter2", "s3cr3t-value", "pw-xyz", "listen-pw"] {
        assert!(!dump.contains(needle), "{needle} leaked: {dump}");
    }
    assert!(dump.contains("[redacted]"));
}

/// Conformance: `KEYTURN_SMTP_URL` alone starts the smtp adapter (it
/// refused to start without `KEYTURN_SMTP_FROM`).
#[test]
fn test_the_smtp_url_alone_has_a_default_sender() {
    let url = [
        "--database-url",
        "postgres://x",
        "--smtp-url",
        "smtp://127.0.0.1:25",
    ];
    let c = parse(&url, None).expect("parses");
    assert_eq!(c.smtp_sender().as_deref(), Some("keyturn@localhost"));
    let c = parse(
        &[
            &url[..],
            &["--public-url", "https://approve.acme.example/k"],
        ]
        .concat(),
        None,
    )
    .expect("parses");
    assert_eq!(
        c.smtp_sender().as_deref(),
        Some("keyturn@approve.acme.example")
    );
    let c = parse(
        &[&url[..], &["--smtp-from", "ops <ops@acme.example>"]].concat(),
        None,
    )
    .expect("parses");
    assert_eq!(c.smtp_sender().as_deref(), Some("ops <ops@acme.example>"));
    let c = parse(&["--database-url", "postgres://x"], None).expect("parses");
    assert_eq!(c.smtp_sender(), None, "no adapter, no sender");
}

#[test]
fn test_the_journal_is_on_by_default_and_off_only_when_asked() {
    let c = parse(&["--database-url", "postgres://x"], None).expect("parses");
    assert!(c.journal);
    assert_eq!(c.journal_dir, PathBuf::from(DEFAULT_JOURNAL_DIR));
    let c = parse(
        &[
            "--database-url",
            "postgres://x",
            "--journal",
            "false",
            "--journal-dir",
            "/srv/kt",
        ],
        None,
    )
    .expect("parses");
    assert!(!c.journal);
    assert_eq!(c.journal_dir, PathBuf::from("/srv/kt"));
}

#[test]
fn test_the_shortest_accepted_lease_is_timeout_plus_3_s() {
    for (lease, timeout, ok) in [("6", "3", true), ("5", "3", false), ("13", "10", true)] {
        let c = parse(
            &[
                "--database-url",
                "postgres://x",
                "--lease-seconds",
                lease,
                "--http-timeout-seconds",
                timeout,
            ],
            None,
        )
        .expect("parses");
        assert_eq!(c.validate().is_ok(), ok, "lease {lease}, timeout {timeout}");
    }
}

#[test]
fn test_ranges_are_refused_as_they_are_read() {
    let cases: &[(&str, &str, bool)] = &[
        ("--lease-linger-ms", "0", true),
        ("--lease-linger-ms", "100", true),
        ("--lease-linger-ms", "101", false),
        ("--poll-ms", "1001", false),
        ("--poll-ms", "0", false),
        ("--workers", "0", false),
        ("--workers", "1024", true),
        ("--workers", "1025", false),
        ("--notify-heartbeat-seconds", "3601", false),
        ("--rpc-connections", "0", false),
        ("--db-connections", "1", false),
        ("--db-connections", "2", true),
        ("--lease-steps", "0", false),
        ("--lease-steps", "1", true),
        ("--lease-steps", "8", true),
        ("--lease-steps", "9", false),
    ];
    for (flag, value, ok) in cases {
        let parsed = parse(&["--database-url", "postgres://x", flag, value], None);
        assert_eq!(parsed.is_ok(), *ok, "{flag} {value}: {parsed:?}");
        if let Err(e) = parsed {
            assert!(e.contains(flag), "{e}");
        }
    }
}

/// Eighth red-team pass (docs/security.md row 93): with one key for
/// effects and notifications, a person aimed a notification at the
/// effects receiver and it verified there. The same key in both settings,
/// written either way, is refused; different keys start.
#[test]
fn test_notifications_and_effects_are_signed_with_different_keys() {
    let key = format!("whsec_{}", SECRET_BASE64.encode([7u8; 32]));
    let other = format!("whsec_{}", SECRET_BASE64.encode([8u8; 32]));
    let raw = String::from_utf8(vec![7u8; 32]).unwrap();
    let with = |effects: &str, notify: &str| {
        parse(
            &[
                "--database-url",
                "postgres://x",
                "--webhook-url",
                "http://127.0.0.1:1/",
                "--webhook-secret",
                effects,
                "--notify-webhook-secret",
                notify,
                "--public-url",
                "http://127.0.0.1:2/",
            ],
            None,
        )
        .unwrap()
        .validate()
    };
    for effects in [&key, &raw] {
        let refused = with(effects, &key).expect_err("one key for both is refused");
        assert!(
            refused
                .to_string()
                .contains("must differ from KEYTURN_WEBHOOK_SECRET"),
            "{refused}"
        );
    }
    with(&key, &other).expect("different keys start");
}

#[test]
fn test_validate_refuses_inconsistent_settings() {
    let base = ["--database-url", "postgres://x"];
    let cases: &[(&[&str], &str)] = &[
        (&["--lease-seconds", "11"], "KEYTURN_LEASE_SECONDS"),
        (&["--lease-seconds", "12"], "KEYTURN_LEASE_SECONDS"),
        (
            &["--lease-seconds", "5", "--http-timeout-seconds", "3"],
            "KEYTURN_LEASE_SECONDS",
        ),
        (
            &["--webhook-url", "http://127.0.0.1:1/"],
            "KEYTURN_WEBHOOK_SECRET",
        ),
        (
            &["--listen-database-url", "host=h port=notaport"],
            "KEYTURN_LISTEN_DATABASE_URL",
        ),
        (
            &["--jwt-secret", "0123456789abcdef0123456789abcdef"],
            "KEYTURN_RPC_DATABASE_URL",
        ),
        (
            &[
                "--jwt-secret",
                "short",
                "--rpc-database-url",
                "postgres://a",
                "--jwt-roles",
                "web_human",
            ],
            "at least 32 bytes",
        ),
        (
            &[
                "--jwt-secret",
                "0123456789abcdef0123456789abcdef",
                "--rpc-database-url",
                "postgres://a",
            ],
            "KEYTURN_JWT_ROLES",
        ),
        (
            &[
                "--jwt-secret",
                "0123456789abcdef0123456789abcdef",
                "--jwt-jwks",
                "/x.json",
                "--rpc-database-url",
                "postgres://a",
                "--jwt-roles",
                "web_human",
            ],
            "not both",
        ),
        (&["--rpc-database-url", "postgres://a"], "only take effect"),
        (
            &["--frame-ancestors", "https://a.example; script-src *"],
            "KEYTURN_FRAME_ANCESTORS",
        ),
        (
            &[
                "--webhook-url",
                "http://127.0.0.1:1/",
                "--webhook-secret",
                "whsec_***",
            ],
            "whsec_",
        ),
    ];
    for (extra, needle) in cases {
        let mut args = base.to_vec();
        args.extend_from_slice(extra);
        let c = parse(&args, None).expect("parses");
        let err = c.validate().expect_err("must be refused").to_string();
        assert!(err.contains(needle), "{extra:?}: {err}");
    }
}
