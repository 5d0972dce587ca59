//! `keyturnd`: wiring only. See the library docs for what each part does.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand};
use keyturnd::config::{self, Config, LogFormat};
use keyturnd::db::{self, Reconciled};
use keyturnd::journal::Journal;
use keyturnd::mcp::upstream::{discovery_loop, Upstreams};
use keyturnd::mcp::Mcp;
use keyturnd::providers::mcp::McpProvider;
use keyturnd::providers::Providers;
use keyturnd::rpc::Rpc;
use keyturnd::server::{self, Limits};
use keyturnd::shutdown::Signals;
use keyturnd::worker::{Dispatcher, Settings};
use keyturnd::{app, operator, AppState, Error};
use std::time::Duration;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// keyturn's dispatch service: leases approved external actions from
/// PostgreSQL, calls the provider once per attempt, records the outcome.
#[derive(Parser)]
#[command(
    name = "keyturnd",
    version,
    after_help = "Every option can also be set in a TOML file named by KEYTURN_CONFIG \
                  (keys are the option names with `_`); the environment and the command line win over it."
)]
struct Cli {
    #[command(flatten)]
    config: Config,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Dispatch approved actions and serve /healthz, /readyz, /metrics, and with a JWT key /rpc, /card, /console (the default).
    Serve,
    /// Settle an `uncertain` action after checking with the provider (role keyturn_operator).
    Reconcile {
        /// The action to settle.
        action_id: Uuid,
        /// What the provider actually did.
        #[arg(long, value_enum)]
        outcome: Reconciled,
        /// Why: kept in the audit trail.
        #[arg(long)]
        note: String,
    },
    /// List the actions waiting for an operator (role keyturn_operator).
    Uncertain {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Check a tenant's audit export (keyturn.audit_export, one JSON object a
    /// line) offline, with no database: exit 0 when it verifies, 1 and the
    /// first bad line otherwise.
    AuditVerify(AuditVerify),
    /// Print a short-lived HS256 JWT signed with KEYTURN_JWT_SECRET, to try
    /// the card and the console without an identity provider (development
    /// and demos only: in production the application's sign-in mints them).
    Jwt {
        /// The database role the JWT selects (one of KEYTURN_JWT_ROLES).
        #[arg(long)]
        role: String,
        /// The principal (`sub`).
        #[arg(long)]
        sub: String,
        /// The tenant (`tenant_id`).
        #[arg(long)]
        tenant: Option<String>,
        /// The session (`session_id`).
        #[arg(long)]
        session: Option<String>,
        /// Seconds until it expires.
        #[arg(long, default_value_t = 900)]
        ttl: u64,
    },
    /// Print a new Web Push VAPID key pair: the private key for
    /// KEYTURN_VAPID_PRIVATE_KEY, and the public key browsers subscribe with
    /// (keyturnd serves it at /card/push-key).
    VapidKeys,
}

/// `keyturnd audit-verify`'s arguments.
#[derive(clap::Args)]
struct AuditVerify {
    /// The export: one event a line, as keyturn.audit_export gives them ("-": standard input).
    file: PathBuf,
    /// The hash the export must continue from: 64 zeros for the whole
    /// chain, a kept hash for an export with `since`. Without it the file
    /// starts where its first line says, which the answer reports.
    #[arg(long)]
    after: Option<String>,
    /// The chain's head kept elsewhere (keyturn.audit_head's hash): the
    /// export must end there, or events at its end are missing.
    #[arg(long)]
    head: Option<String>,
}

/// `keyturnd audit-verify`: needs no database and no setting, so it is
/// parsed apart from the service's configuration.
#[derive(Parser)]
#[command(name = "keyturnd")]
struct AuditVerifyCli {
    #[command(subcommand)]
    command: AuditVerifyOnly,
}

#[derive(Subcommand)]
enum AuditVerifyOnly {
    AuditVerify(AuditVerify),
}

fn audit_verify(args: &AuditVerify) -> ExitCode {
    use keyturnd::audit::{verify, Verdict};
    let read = if args.file.as_os_str() == "-" {
        verify(
            std::io::stdin().lock(),
            args.after.as_deref(),
            args.head.as_deref(),
        )
    } else {
        match std::fs::File::open(&args.file) {
            Ok(f) => verify(
                std::io::BufReader::new(f),
                args.after.as_deref(),
                args.head.as_deref(),
            ),
            Err(e) => Err(e),
        }
    };
    match read {
        Ok(Verdict::Verified {
            events,
            start,
            head,
        }) => {
            if start == keyturn_core::audit::CHAIN_START {
                println!("verified: {events} events, head {head}");
            } else {
                println!(
                    "verified: {events} events after {start}, head {head} (the file starts after the chain's start: --after <hash kept elsewhere> checks where)"
                );
            }
            ExitCode::SUCCESS
        }
        Ok(Verdict::Bad { line, why }) => {
            println!("line {line}: {why}");
            ExitCode::from(1)
        }
        // Not verified: 1, like any other export that does not verify.
        Err(e) => {
            eprintln!(
                "keyturnd audit-verify: cannot read {}: {e}",
                args.file.display()
            );
            ExitCode::from(1)
        }
    }
}

fn main() -> ExitCode {
    if std::env::args_os()
        .nth(1)
        .is_some_and(|a| a == "audit-verify")
    {
        return match AuditVerifyCli::try_parse() {
            Ok(AuditVerifyCli {
                command: AuditVerifyOnly::AuditVerify(args),
            }) => audit_verify(&args),
            Err(e) => e.exit(),
        };
    }
    // Needs no configuration at all, DATABASE_URL included.
    if std::env::args().nth(1).as_deref() == Some("vapid-keys") {
        let (private, public) = config::VapidKey::generate();
        println!("KEYTURN_VAPID_PRIVATE_KEY={}", private.expose());
        println!("# the public key (applicationServerKey), served at /card/push-key:");
        println!("# {public}");
        return ExitCode::SUCCESS;
    }
    let file = std::env::var_os("KEYTURN_CONFIG").map(PathBuf::from);
    let mut cli = match config::parse_with_file::<Cli>(std::env::args_os(), file.as_deref()) {
        Ok(Ok(cli)) => cli,
        Ok(Err(clap_error)) => clap_error.exit(),
        Err(e) => {
            eprintln!("keyturnd: {e}");
            return ExitCode::from(2);
        }
    };
    if let Some(Command::AuditVerify(args)) = &cli.command {
        return audit_verify(args);
    }
    if let Some(file) = &file {
        match config::read_upstreams(file) {
            Ok(upstreams) => cli.config.mcp_upstreams = upstreams,
            Err(e) => {
                eprintln!("keyturnd: {e}");
                return ExitCode::from(2);
            }
        }
    }
    init_logging(cli.config.log_format);
    // rmcp's reqwest has no TLS crypto provider of its own: ring, as the
    // rest of keyturnd uses. Err only when one is installed already.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(error = %e, "cannot start the async runtime");
            return ExitCode::FAILURE;
        }
    };
    let url = cli.config.database_url.clone();
    let result = runtime.block_on(async move {
        match cli.command.unwrap_or(Command::Serve) {
            Command::Serve => serve(cli.config).await,
            Command::Reconcile {
                action_id,
                outcome,
                note,
            } => operator::reconcile(url.expose(), action_id, outcome, &note)
                .await
                .map(|line| println!("{line}")),
            Command::Uncertain { json } => operator::uncertain(url.expose(), json)
                .await
                .map(|text| print!("{}", text.trim_end().to_owned() + "\n")),
            // Answered above, before the runtime starts.
            Command::AuditVerify(_) => Ok(()),
            Command::VapidKeys => unreachable!("answered before the configuration is read"),
            Command::Jwt {
                role,
                sub,
                tenant,
                session,
                ttl,
            } => match &cli.config.jwt_secret {
                Some(secret) => keyturnd::jwt::mint_hs256(
                    secret.expose().as_bytes(),
                    &role,
                    [
                        ("sub", Some(sub.as_str())),
                        ("tenant_id", tenant.as_deref()),
                        ("session_id", session.as_deref()),
                    ],
                    ttl,
                )
                .map(|jwt| println!("{jwt}")),
                None => Err(Error::Config(
                    "keyturnd jwt signs with KEYTURN_JWT_SECRET, which is not set".into(),
                )),
            },
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "keyturnd failed");
            ExitCode::FAILURE
        }
    }
}

fn init_logging(format: LogFormat) {
    let mut filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // rmcp logs MCP session ids at INFO and whole messages, card links with
    // their one-time codes included, at DEBUG: its warnings only, unless
    // RUST_LOG names it.
    if !std::env::var("RUST_LOG")
        .unwrap_or_default()
        .contains("rmcp")
    {
        if let Ok(quiet) = "rmcp=warn".parse() {
            filter = filter.add_directive(quiet);
        }
    }
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        // Plain text, so that the writer can escape every terminal escape
        // an event quotes (keyturnd::log).
        .with_ansi(false)
        .with_writer(keyturnd::log::OneLinePerEvent);
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
}

async fn serve(config: Config) -> Result<(), Error> {
    let checked = config.validate()?;
    let mut state = AppState::new()
        .with_csp(checked.csp.clone())
        .with_vapid_public_key(
            checked
                .vapid
                .as_ref()
                .filter(|_| config.public_url.is_some())
                .map(|k| k.public_key().to_owned()),
        );
    let shutdown = CancellationToken::new();
    Signals::install()?.spawn(shutdown.clone(), state.health.clone());

    // Before anything else: a journal that cannot be used stops the start.
    let (journal, replay) = if config.journal {
        let dir = config.journal_path();
        let (journal, replay) = Journal::open(&dir, state.metrics.clone())?;
        tracing::info!(
            dir = %dir.display(),
            to_replay = replay.len(),
            "outcome journal open"
        );
        (journal, replay)
    } else {
        tracing::warn!(
            "KEYTURN_JOURNAL=false: observed outcomes are not journaled; those not yet recorded when keyturnd dies are lost and their actions end uncertain"
        );
        (Journal::disabled(state.metrics.clone()), Vec::new())
    };

    let pool = db::pool(
        config.database_url.expose(),
        config.db_connections,
        state.metrics.clone(),
    )?;

    // Before the listener: a role allowlist the database refuses stops
    // keyturnd here, before it answers anything.
    match Rpc::start(&config, Arc::clone(&state.metrics), pool.clone(), &shutdown).await? {
        Some(rpc) => state = state.with_rpc(rpc),
        None if config.rpc_enabled() => return Ok(()),
        None => {}
    }

    let upstreams = Arc::new(Upstreams::from_config(&config)?);
    if let Some(why) = config.mcp_ignored() {
        tracing::warn!("{why}");
    }
    let mcp = Mcp::start(
        &config,
        Arc::clone(&state.metrics),
        pool.clone(),
        Arc::clone(&upstreams),
        &shutdown,
    )
    .await?
    .map(Arc::new);
    match &mcp {
        Some(mcp) => state = state.with_mcp(Arc::clone(mcp)),
        None if config.mcp_enabled() => return Ok(()),
        None => {}
    }

    let mut providers = Providers::from_config(&config, &checked)?;
    let discovery = (!upstreams.is_empty()).then(|| {
        providers.insert(Arc::new(McpProvider::new(Arc::clone(&upstreams))));
        state = state.clone().with_upstreams(Arc::clone(&upstreams));
        tokio::spawn(discovery_loop(
            Arc::clone(&upstreams),
            pool.clone(),
            Arc::clone(&state.metrics),
            Duration::from_secs(config.mcp_refresh_seconds),
            config.call_timeout(),
            shutdown.clone(),
        ))
    });
    if config.public_url.is_none() {
        tracing::warn!(
            "KEYTURN_PUBLIC_URL is not set: no notification is sent (each is cancelled once its action stops waiting)"
        );
    }
    if providers.names().is_empty() {
        tracing::warn!(
            "no provider is configured (set KEYTURN_WEBHOOK_URL or KEYTURN_SMTP_URL): nothing will be leased; approved external actions stay queued"
        );
    }
    let settings = Settings::from_config(&config);
    tracing::info!(
        listen = %config.listen,
        worker = %settings.worker_name,
        providers = ?providers.names(),
        workers = config.workers,
        db_connections = config.db_connections,
        lease_seconds = config.lease_seconds,
        listen_notify = config.listen_notify,
        rpc = state.rpc.is_some(),
        mcp = state.mcp.is_some(),
        upstreams = ?upstreams.all().map(|u| u.name()).collect::<Vec<_>>(),
        "keyturnd starting"
    );

    let listener = tokio::net::TcpListener::bind(config.listen).await?;
    // The HTTP server outlives the drain, so /readyz can say 503 meanwhile;
    // it is told to stop with the deadline by which every connection is
    // closed: the SIGTERM plus KEYTURN_SHUTDOWN_SECONDS.
    let (http_stop, http_deadline) = tokio::sync::oneshot::channel::<Instant>();
    let server = tokio::spawn(server::serve(
        listener,
        app(state.clone()),
        Limits::from_config(&config),
        async move { http_deadline.await.unwrap_or_else(|_| Instant::now()) },
    ));
    let signalled = {
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            shutdown.cancelled().await;
            Instant::now()
        })
    };

    let dispatched = Dispatcher::new(
        pool,
        providers,
        Arc::clone(&state.metrics),
        Arc::clone(&state.health),
        settings,
    )
    .with_journal(Arc::new(journal), replay)
    .run(shutdown.clone())
    .await;

    let since = if shutdown.is_cancelled() {
        signalled.await.unwrap_or_else(|_| Instant::now())
    } else {
        signalled.abort();
        Instant::now()
    };
    // The MCP sessions end once the calls in flight are recorded: their
    // streams close, so the server's drain does not wait on them.
    if let Some(mcp) = &mcp {
        mcp.close_sessions();
    }
    if let Some(discovery) = discovery {
        let _ = discovery.await;
    }
    let _ = http_stop.send(since + Duration::from_secs(config.shutdown_seconds));
    if let Err(e) = server.await {
        tracing::error!(error = %e, "HTTP server task failed");
    }
    dispatched?;
    tracing::info!("keyturnd stopped");
    Ok(())
}
