//! Card sessions: how a link with no credential in it becomes the right to
//! decide the actions it names, and nothing else (docs/http.md, "Card
//! links").
//!
//! A link is `/card#a=<action_id>[&a=…]&c=<code>`: the code is one-time,
//! stored by the database only as a digest. `POST /card/session` with
//! `{"code", "action_ids"}` asks the database to redeem it
//! (`keyturn.redeem_link_code`), which answers once with a session bearer
//! (`kts_…`, at most 15 minutes) and a fresh token for each action; a used,
//! expired or unknown code, or other action ids, get 401 and change nothing.
//! The card then calls `/rpc` with `Authorization: Bearer kts_…`: keyturnd
//! asks the database who that is (`keyturn.card_session`) and runs the call
//! as that person, under the role the code names (or `KEYTURN_CARD_ROLE`),
//! for `preview`, `approve`, `reject` and `revise` of the session's actions
//! only; `POST /card/token` gives it a fresh token for one of them
//! (`issue_token`, outside `/rpc`). After redemption the URL holds nothing that
//! works, so a browser's history, its sync and its address bar's
//! suggestions hold nothing either.

use deadpool_postgres::Pool;
use serde::Deserialize;
use serde_json::{json, Map, Value};

use crate::db;
use crate::error::Error;
use crate::jwt::Verified;

/// What marks a card session's bearer: a JWT never starts so.
pub const SESSION_PREFIX: &str = "kts_";

/// The `/rpc` calls a card session may make: the card's, on its actions.
pub const CARD_FUNCTIONS: &[&str] = &["preview", "approve", "reject", "revise"];

/// The one call of `POST /card/token`: each card opened for an action takes
/// a fresh token, so a card opened before it (another approver's, for a
/// quorum, or the same person's other device) holds a dead one and must take
/// its own again (docs/security.md, row 74). A route of its own keeps
/// `/rpc` to the four calls above.
pub const TOKEN_FUNCTIONS: &[&str] = &["issue_token"];

/// The card session's bearer in an `Authorization` header, if it is one.
pub fn bearer_of(authorization: Option<&str>) -> Option<&str> {
    crate::jwt::bearer(authorization)
        .ok()
        .filter(|t| t.starts_with(SESSION_PREFIX))
}

/// Card sessions on the dispatcher's connection.
pub struct Cards {
    dispatcher: Pool,
    card_role: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RedeemBody {
    code: String,
    action_ids: Vec<uuid::Uuid>,
}

impl Cards {
    pub fn new(dispatcher: Pool, card_role: Option<String>) -> Cards {
        Cards {
            dispatcher,
            card_role,
        }
    }

    /// The role a session runs as: the code's, else the card role; either
    /// must be one `/rpc` may select (`allowed`), or the link cannot act.
    fn role(&self, named: Option<String>, allowed: impl Fn(&str) -> bool) -> Result<String, Error> {
        let role = named
            .or_else(|| self.card_role.clone())
            .ok_or(Error::Unauthorized(
                "this link's card session has no role to run as: set KEYTURN_CARD_ROLE",
            ))?;
        if !allowed(&role) {
            return Err(Error::RoleNotAllowed);
        }
        Ok(role)
    }

    /// `POST /card/session`: `{"session", "expires_at", "tokens"}` for a code
    /// that redeems; 401 for any other, the same for each (no answer says
    /// whether a code existed).
    pub async fn redeem(
        &self,
        body: &[u8],
        allowed: impl Fn(&str) -> bool,
    ) -> Result<Value, Error> {
        let body: RedeemBody = serde_json::from_slice(body).map_err(|_| {
            Error::BadBody(
                r#"the body must be {"code": "<the link's c=>", "action_ids": ["<uuid>", …]}"#
                    .into(),
            )
        })?;
        let mut client = self.dispatcher.get().await?;
        // The code is used up only with the session made: a refusal of the
        // role it would run as rolls the redemption back, and the person's
        // link still works once keyturnd is set up.
        let tx = db::transaction(&mut client).await?;
        let redeemed = db::rpc::redeem_link_code(&tx, &body.code, &body.action_ids)
            .await?
            .ok_or(Error::Unauthorized(
                "the link's code is used, expired or unknown, or names other actions: ask for a new link",
            ))?;
        self.role(redeemed.db_role, allowed)?;
        db::commit(tx).await?;
        Ok(json!({
            "session": redeemed.session,
            "expires_at": redeemed.expires_at,
            "tokens": redeemed.tokens,
        }))
    }

    /// The caller a card session's bearer stands for, for `function` with
    /// `args`: 401 once the session has ended; 403 for a call or an action
    /// the session is not for.
    pub async fn caller(
        &self,
        bearer: &str,
        function: &str,
        args: &Map<String, Value>,
        allowed: impl Fn(&str) -> bool,
        functions: &[&str],
    ) -> Result<Verified, Error> {
        let client = self.dispatcher.get().await?;
        let session = db::rpc::card_session(&client, bearer)
            .await?
            .ok_or(Error::Unauthorized(
                "the card session has ended: open the link again, or ask for a new one",
            ))?;
        if !functions.contains(&function) {
            return Err(Error::CardForbidden(
                "a card session may only preview, approve, reject and revise its actions (and take a fresh token for them at POST /card/token)",
            ));
        }
        let action = args
            .get("action_id")
            .and_then(Value::as_str)
            .and_then(|s| uuid::Uuid::parse_str(s).ok());
        if !action.is_some_and(|a| session.action_ids.contains(&a)) {
            return Err(Error::CardForbidden(
                "this card session is not for that action",
            ));
        }
        let role = self.role(session.db_role, allowed)?;
        Ok(Verified {
            role,
            claims: session.claims.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_only_a_session_bearer_is_taken_for_one() {
        assert_eq!(bearer_of(Some("Bearer kts_abc")), Some("kts_abc"));
        assert_eq!(bearer_of(Some("bearer  kts_abc ")), Some("kts_abc"));
        assert_eq!(bearer_of(Some("Bearer eyJhbGciOi.x.y")), None);
        assert_eq!(bearer_of(Some("kts_abc")), None);
        assert_eq!(bearer_of(None), None);
    }
}
