//! Action ids: UUIDv7, time-ordered.
//!
//! A random (v4) primary key sends every insert to a random leaf of
//! `action_pkey`: at millions of rows that means a cold page per insert and,
//! after each checkpoint, a full-page image in the WAL for each one. A v7 id
//! starts with the creation time in milliseconds, so new rows land on the
//! right edge of the index. The id reveals when the action was proposed,
//! which `created_at` shows anyway; the token, not the id, is the secret.

use pgrx::prelude::*;

#[pg_extern(name = "_uuid_v7", volatile, parallel_safe)]
fn uuid_v7() -> pgrx::Uuid {
    pgrx::Uuid::from_bytes(*uuid::Uuid::now_v7().as_bytes())
}

/// A notification's id (sql/064_notify.sql): a v7, for the same index
/// locality, with its version nibble set to 8, so that the dispatcher's
/// calls tell it from an action's id without a lookup
/// (`keyturn._is_notification`).
#[pg_extern(name = "_notification_id", volatile, parallel_safe)]
fn notification_id() -> pgrx::Uuid {
    let mut bytes = *uuid::Uuid::now_v7().as_bytes();
    bytes[6] = (bytes[6] & 0x0f) | 0x80;
    pgrx::Uuid::from_bytes(bytes)
}
