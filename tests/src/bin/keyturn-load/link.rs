//! One client's connection: every call is its own transaction, with the
//! identity asserted inside it (set_config(…, true)), as a pooled
//! application asserts it, and sometimes a short lock or statement timeout.
//! A terminated backend is replaced on the next call; a deadlock or
//! serialization failure is retried, and every attempt is counted.

use std::time::Duration;

use keyturn_tests::tally::{outcome, Tally};
use proptest::prelude::RngExt;
use proptest::test_runner::TestRng;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Error, NoTls, Row};

/// Who a call says it is: (tenant, principal, session).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Who {
    pub tenant: String,
    pub principal: String,
    pub session: String,
}

/// Retries of one call on 40001/40P01 before it counts as not retried.
const RETRIES: usize = 10;

/// Outcomes a retry answers.
fn retryable(code: &str) -> bool {
    code == "40001" || code == "40P01"
}

/// The outcome a call ends in when its retries ran out.
pub const EXHAUSTED: &str = "retries-exhausted";

pub struct Link {
    login: &'static str,
    application_name: String,
    client: Option<Client>,
    /// How often (per mille) a call runs under a short lock_timeout, under a
    /// short statement_timeout, and in REPEATABLE READ.
    timeouts_per_mille: u32,
}

impl Link {
    pub fn new(login: &'static str, application_name: &str, timeouts_per_mille: u32) -> Link {
        Link {
            login,
            application_name: application_name.to_owned(),
            client: None,
            timeouts_per_mille,
        }
    }

    async fn client(&mut self) -> Result<&Client, Error> {
        if self.client.as_ref().is_none_or(Client::is_closed) {
            let url = format!(
                "host=127.0.0.1 port={} user={} dbname={} application_name={}",
                keyturn_tests::port(),
                self.login,
                keyturn_tests::dbname(),
                self.application_name
            );
            let (client, connection) = tokio_postgres::connect(&url, NoTls).await?;
            tokio::spawn(async move {
                let _ = connection.await;
            });
            self.client = Some(client);
        }
        Ok(self.client.as_ref().expect("connected above"))
    }

    /// `sql` in a transaction of its own, as `who` (None: no identity, for
    /// the dispatcher, admin and operator calls), with the fault settings
    /// `rng` draws. Counts the outcome of every attempt under `call` and
    /// retries deadlocks and serialization failures; returns the rows, or the
    /// last error's outcome.
    pub async fn call(
        &mut self,
        tally: &mut Tally,
        rng: &mut TestRng,
        call: &str,
        who: Option<&Who>,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, String> {
        for _ in 0..RETRIES {
            let (begin, fault) = self.fault(rng);
            match self.once(begin, who, fault.as_deref(), sql, params).await {
                Ok(rows) => {
                    tally.add(call, "ok");
                    return Ok(rows);
                }
                Err(e) => {
                    let o = outcome(&e);
                    tally.add(call, &o);
                    if o == "closed" || o == "57P01" {
                        self.client = None;
                    }
                    if !retryable(&o) {
                        return Err(o);
                    }
                    tokio::time::sleep(Duration::from_millis(rng.random_range(1..20))).await;
                }
            }
        }
        tally.add(call, EXHAUSTED);
        Err(EXHAUSTED.to_owned())
    }

    /// How this transaction begins (sometimes REPEATABLE READ, where a
    /// concurrent approval is a 40001 to retry), and sometimes a short lock
    /// or statement timeout for it.
    fn fault(&self, rng: &mut TestRng) -> (&'static str, Option<String>) {
        let begin = if rng.random_range(0..1000) < self.timeouts_per_mille {
            "BEGIN ISOLATION LEVEL REPEATABLE READ"
        } else {
            "BEGIN"
        };
        let roll = rng.random_range(0..1000);
        let local = if roll < self.timeouts_per_mille {
            Some(format!(
                "SET LOCAL lock_timeout = '{}ms'",
                rng.random_range(1..10)
            ))
        } else if roll < 2 * self.timeouts_per_mille {
            Some(format!(
                "SET LOCAL statement_timeout = '{}ms'",
                rng.random_range(1..40)
            ))
        } else {
            None
        };
        (begin, local)
    }

    async fn once(
        &mut self,
        begin: &str,
        who: Option<&Who>,
        fault: Option<&str>,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, Error> {
        let client = self.client().await?;
        let r = async {
            client.batch_execute(begin).await?;
            if let Some(w) = who {
                client
                    .execute(
                        "SELECT set_config('keyturn.tenant', $1, true), set_config('keyturn.principal', $2, true), \
                         set_config('keyturn.session', $3, true)",
                        &[&w.tenant, &w.principal, &w.session],
                    )
                    .await?;
            }
            if let Some(f) = fault {
                client.batch_execute(f).await?;
            }
            let rows = client.query(sql, params).await?;
            client.batch_execute("COMMIT").await?;
            Ok(rows)
        }
        .await;
        // The statement's error is the answer. A cancel meant for the
        // statement before may land on any of these, the ROLLBACK too; a
        // connection whose transaction might still be open is not reused.
        if r.is_err() && client.batch_execute("ROLLBACK").await.is_err() {
            self.client = None;
        }
        r
    }
}
