//! Signs a person's JWT for keyturnd's `/rpc`, for demos and shell tests.
//!
//! ```text
//! cargo run -p keyturnd --example jwt -- --secret S \
//!     '{"role": "app_human", "tenant_id": "acme", "sub": "alice", "session_id": "s1"}'
//! ```
//!
//! Prints an HS256 token (the `KEYTURN_JWT_SECRET` kind) whose claims are the
//! given JSON object, with `exp` five minutes from now unless the object has
//! one. A real deployment's tokens come from its identity provider.

use std::time::{SystemTime, UNIX_EPOCH};

use clap::Parser;
use jsonwebtoken::{encode, EncodingKey, Header};
use serde_json::{Map, Value};

#[derive(Parser)]
struct Args {
    /// The HS256 secret, as `KEYTURN_JWT_SECRET`.
    #[arg(long)]
    secret: String,
    /// The claims, a JSON object.
    claims: String,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let mut claims: Map<String, Value> = serde_json::from_str(&args.claims)?;
    if !claims.contains_key("exp") {
        let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs();
        claims.insert("exp".into(), (now + 300).into());
    }
    let key = EncodingKey::from_secret(args.secret.as_bytes())?;
    println!("{}", encode(&Header::default(), &claims, &key)?);
    Ok(())
}
