//! The Tasks extension (SEP-2663, `io.modelcontextprotocol/tasks`): a write
//! call from a client that declared it becomes a task, the task's id is the
//! action's, and its state follows the action's, as the database gives it
//! (`keyturn.mcp_task`):
//!
//! | action | task |
//! |---|---|
//! | `pending`, the client holds the card link | `input_required`: the link, a URL elicitation |
//! | `pending`, no link for this client | `working`, waiting in the approvers' queue |
//! | approved, not yet final (`queued` … `executing`) | `working` |
//! | final | `completed`: the proposal's result, `isError` unless `succeeded` |
//!
//! The one thing keyturnd keeps is each pending task's card link: its
//! one-time code can be minted once, within two minutes of the proposal
//! (`keyturn.link_code`), and every `tasks/get` while the person has not
//! decided must show the client the same request. A link lives in this
//! process's memory until its action leaves `pending` or expires, and is
//! shown only to the agent session that proposed, as the database reads
//! the session (`same_session` of `keyturn.mcp_task`; another session of
//! the same principal sees the task `working`). Another keyturnd (or this
//! one, restarted) has no link to show, and answers `working`.

use std::collections::HashMap;
use std::sync::Mutex;

use chrono::{DateTime, SecondsFormat, Utc};
use rmcp::model::{
    CallToolResult, DetailedTask, InputRequests, JsonObject, Task, TaskPayload, TaskStatus,
};
use serde_json::Value;
use uuid::Uuid;

use crate::db::mcp::OwnAction;

/// How often a client should ask, in milliseconds: a person's decision
/// takes seconds at best.
pub const POLL_MS: u64 = 2_000;

/// Links kept at most, and at most by one identity. Past either, a new
/// task keeps none (it is `working`, and its person is reached through the
/// queue and notifications); a kept link is never dropped for another's,
/// so no agent can take the links of others' tasks away.
const MAX_LINKS: usize = 100_000;
const LINKS_PER_IDENTITY: usize = 1_000;

/// A kept link: the URL, until when, whose task.
#[derive(Debug)]
struct Kept {
    url: url::Url,
    until: DateTime<Utc>,
    owner: String,
}

/// The card link of each pending task this process created.
#[derive(Debug, Default)]
pub struct Links {
    map: Mutex<HashMap<Uuid, Kept>>,
}

impl Links {
    /// Keeps `url` for `action_id` until `expires_at`, for the identity
    /// `owner`; `false` when it cannot be kept (see [`MAX_LINKS`]).
    pub fn keep(
        &self,
        action_id: Uuid,
        url: url::Url,
        expires_at: DateTime<Utc>,
        owner: &str,
    ) -> bool {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        let mine = map.values().filter(|k| k.owner == owner).count();
        if map.len() >= MAX_LINKS || mine >= LINKS_PER_IDENTITY {
            let now = Utc::now();
            map.retain(|_, k| k.until > now);
            let mine = map.values().filter(|k| k.owner == owner).count();
            if map.len() >= MAX_LINKS || mine >= LINKS_PER_IDENTITY {
                return false;
            }
        }
        let kept = Kept {
            url,
            until: expires_at,
            owner: owner.to_owned(),
        };
        map.insert(action_id, kept);
        true
    }

    /// The link of a pending task, if this process holds it.
    pub fn get(&self, action_id: Uuid) -> Option<url::Url> {
        let map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        map.get(&action_id).map(|k| k.url.clone())
    }

    /// Forgets a task's link: its action left `pending`.
    pub fn forget(&self, action_id: Uuid) {
        self.map
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&action_id);
    }
}

fn rfc3339(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// The task a new proposal starts as: `input_required` when the client
/// was given the card link, `working` otherwise.
pub fn created(action_id: Uuid, link_given: bool) -> Task {
    let now = rfc3339(Utc::now());
    let status = if link_given {
        TaskStatus::InputRequired
    } else {
        TaskStatus::Working
    };
    Task::new(action_id.to_string(), status, now.clone(), now)
        .with_poll_interval_ms(POLL_MS)
        .with_status_message(waiting(link_given))
}

fn waiting(link_given: bool) -> &'static str {
    if link_given {
        "waiting for a person to approve it on keyturn's card"
    } else {
        "waiting for a person to decide it in keyturn (their queue and notifications)"
    }
}

/// The task of `action` now. `asked`: the card link's request, while it is
/// pending and the client holds the link; `done`: the call's result, once
/// final.
pub fn detailed(
    action: &OwnAction,
    asked: Option<InputRequests>,
    done: Option<CallToolResult>,
) -> DetailedTask {
    let p = &action.proposed;
    let task = Task::new(
        p.action_id.to_string(),
        TaskStatus::Working,
        rfc3339(action.created_at),
        rfc3339(action.updated_at),
    )
    .with_poll_interval_ms(POLL_MS);
    let (payload, message) = match (done, asked) {
        (Some(result), _) => {
            let result = match serde_json::to_value(result) {
                Ok(Value::Object(o)) => o,
                _ => JsonObject::new(),
            };
            (
                TaskPayload::Completed { result },
                format!("the action is {}", p.status),
            )
        }
        (None, Some(input_requests)) if p.status == "pending" => (
            TaskPayload::InputRequired { input_requests },
            waiting(true).to_owned(),
        ),
        (None, _) if p.status == "pending" => (TaskPayload::Working, waiting(false).to_owned()),
        (None, _) => (
            TaskPayload::Working,
            format!("approved; the action is {}", p.status),
        ),
    };
    DetailedTask::new(task.with_status_message(message), payload)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::db::mcp::Proposed;

    fn action(status: &str, result: Option<Value>) -> OwnAction {
        OwnAction {
            proposed: Proposed {
                action_id: Uuid::nil(),
                status: status.into(),
                summary: "s".into(),
                expires_at: Utc::now(),
            },
            result,
            created_at: Utc::now(),
            updated_at: Utc::now(),
            same_session: true,
        }
    }

    #[test]
    fn test_the_task_follows_the_action() {
        let asked = InputRequests::new();
        assert_eq!(
            detailed(&action("pending", None), Some(asked.clone()), None).status(),
            TaskStatus::InputRequired
        );
        assert_eq!(
            detailed(&action("pending", None), None, None).status(),
            TaskStatus::Working
        );
        // A link is shown only while the person has not decided.
        assert_eq!(
            detailed(&action("executing", None), Some(asked), None).status(),
            TaskStatus::Working
        );
        let done = CallToolResult::success(vec![]);
        let t = detailed(&action("succeeded", Some(Value::Null)), None, Some(done));
        assert_eq!(t.status(), TaskStatus::Completed);
    }

    #[test]
    fn test_links_are_kept_until_forgotten() {
        let links = Links::default();
        let id = Uuid::new_v4();
        let url = url::Url::parse("https://k.example/card#a=x&c=y").unwrap();
        assert!(links.keep(id, url.clone(), Utc::now(), "alice"));
        assert_eq!(links.get(id), Some(url));
        links.forget(id);
        assert_eq!(links.get(id), None);
    }

    #[test]
    fn test_no_identity_takes_anothers_links_away() {
        let links = Links::default();
        let url = url::Url::parse("https://k.example/card#a=x&c=y").unwrap();
        let later = Utc::now() + chrono::Duration::hours(1);
        let alices = Uuid::new_v4();
        assert!(links.keep(alices, url.clone(), later, "alice"));
        // Bob fills his share; his next is refused, alice's link stays.
        for _ in 0..LINKS_PER_IDENTITY {
            assert!(links.keep(Uuid::new_v4(), url.clone(), later, "bob"));
        }
        assert!(!links.keep(Uuid::new_v4(), url.clone(), later, "bob"));
        assert_eq!(links.get(alices), Some(url.clone()));
        // Expired links make room again.
        let old = Utc::now() - chrono::Duration::seconds(1);
        let links = Links::default();
        for _ in 0..LINKS_PER_IDENTITY {
            assert!(links.keep(Uuid::new_v4(), url.clone(), old, "bob"));
        }
        assert!(links.keep(Uuid::new_v4(), url, later, "bob"));
    }
}
