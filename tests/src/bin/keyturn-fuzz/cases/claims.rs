//! Identity: generated `request.jwt.claims` texts and `keyturn.*` setting
//! values, valid and hostile, read back through current_tenant,
//! current_principal and current_session, each compared with what the
//! generator's model says keyturn must read (claims.rs in the generators).
//! The settings hold a sentinel identity beside the claims: a claims text
//! that is set is the only source, so the sentinel must never show. Some
//! cases set it all for the session, which must read as no identity. Then
//! calls that need identity must refuse (42501) or act, never fail; alice's
//! own claims must be able to propose.

use super::Ctx;
use crate::db::Ident;
use crate::generators::claims::{claims, setting_value, Expect};

const SENTINEL: [&str; 3] = ["Sentinel-Tenant", "Sentinel-Principal", "Sentinel-Session"];

fn sentinel() -> Option<(String, String, String)> {
    Some((SENTINEL[0].into(), SENTINEL[1].into(), SENTINEL[2].into()))
}

fn exactly(values: [&str; 3]) -> Vec<Expect> {
    values
        .iter()
        .map(|s| Expect::Is(Some((*s).to_owned())))
        .collect()
}

pub async fn case(ctx: &mut Ctx<'_>) {
    let db = ctx.db;
    let session_level = ctx.roll(5);
    let variant = ctx.draw(0u8..10);
    let (who, mut expect, real) = match variant {
        0..6 => {
            let c = ctx.draw(claims());
            ctx.input("claims", &c.text);
            (
                Ident {
                    gucs: sentinel(),
                    claims: Some(c.text),
                    session_level,
                },
                c.expect.to_vec(),
                false,
            )
        }
        6 => {
            // alice's own identity, as PostgREST passes a verified JWT's claims.
            let text = serde_json::json!({"role": "authenticated", "sub": "alice", "tenant_id": ctx.fx.tenant,
                                          "session_id": "s1", "exp": 1999999999})
            .to_string();
            ctx.input("claims", &text);
            let expect = exactly([ctx.fx.tenant.as_str(), "alice", "s1"]);
            (
                Ident {
                    gucs: None,
                    claims: Some(text),
                    session_level,
                },
                expect,
                true,
            )
        }
        7 => {
            // An empty claims text is no claims: the settings speak.
            (
                Ident {
                    gucs: sentinel(),
                    claims: Some(String::new()),
                    session_level,
                },
                exactly(SENTINEL),
                false,
            )
        }
        _ => {
            let (t, p, s) = ctx.draw((setting_value(), setting_value(), setting_value()));
            ctx.input("settings", &format!("{:?} {:?} {:?}", t.0, p.0, s.0));
            (
                Ident {
                    gucs: Some((t.0, p.0, s.0)),
                    claims: None,
                    session_level,
                },
                vec![t.1, p.1, s.1],
                false,
            )
        }
    };
    if session_level {
        ctx.input("set for", "the session");
        expect = vec![Expect::Is(None), Expect::Is(None), Expect::Is(None)];
    }
    let claims_set = who.claims.as_deref().is_some_and(|c| !c.is_empty());
    let sql =
        "SELECT keyturn.current_tenant(), keyturn.current_principal(), keyturn.current_session()";
    if let Ok(rows) = ctx.call("identity", &db.agent, &who, sql, &[]).await {
        for (i, (part, e)) in ["tenant", "principal", "session"]
            .iter()
            .zip(&expect)
            .enumerate()
        {
            let got: Option<String> = rows[0].get(i);
            if !e.admits(got.as_deref()) {
                ctx.finding(format!("{part} read as {got:?}, the model expects {e:?}"));
            }
            if claims_set && got.as_deref() == Some(SENTINEL[i]) {
                ctx.finding(format!(
                    "{part} came from the settings although claims were set"
                ));
            }
        }
    }
    let _ = ctx
        .call(
            "pending (fuzzed identity)",
            &db.human,
            &who,
            "SELECT count(*) FROM keyturn.pending()",
            &[],
        )
        .await;
    let tool = ctx.fx.open.clone();
    let sql = "SELECT action_id FROM keyturn.propose($1, '{}')";
    let r = ctx
        .call("propose (fuzzed identity)", &db.agent, &who, sql, &[&tool])
        .await;
    if real && !session_level && r.is_err() {
        let msg = crate::judge::message(&r);
        ctx.finding(format!("alice's own claims could not propose: {msg}"));
    }
}
