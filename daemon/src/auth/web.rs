//! Logins for the web view, Jupyter-style: `alexandria web` asks the daemon for a
//! one-time token (valid 10 minutes, good for one login); `/login?token=` swaps it for
//! a session cookie. Only SHA-256 digests of tokens and session ids are kept, in memory:
//! a daemon restart signs everyone out, which is what a local tool should do.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use ring::digest;
use ring::rand::{SecureRandom, SystemRandom};

/// How long a one-time login token stays valid.
pub const LOGIN_TOKEN_TTL: Duration = Duration::from_secs(600);
/// How long a web session lives without a request.
pub const SESSION_IDLE: Duration = Duration::from_secs(12 * 3600);
/// Bounds, so nothing a caller does grows memory without limit.
const MAX_PENDING_LOGINS: usize = 64;
const MAX_SESSIONS: usize = 256;

#[derive(Default)]
pub struct WebLogins {
    pending: Mutex<HashMap<Vec<u8>, Instant>>,
    sessions: Mutex<HashMap<Vec<u8>, Instant>>,
}

fn digest_of(secret: &str) -> Vec<u8> {
    digest::digest(&digest::SHA256, secret.as_bytes())
        .as_ref()
        .to_vec()
}

/// 32 random bytes as hex.
pub fn random_secret() -> Result<String, ring::error::Unspecified> {
    let mut bytes = [0u8; 32];
    SystemRandom::new().fill(&mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

impl WebLogins {
    /// A new one-time login token.
    pub fn issue(&self) -> Result<String, ring::error::Unspecified> {
        let token = random_secret()?;
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        pending.retain(|_, issued| now.duration_since(*issued) < LOGIN_TOKEN_TTL);
        if pending.len() >= MAX_PENDING_LOGINS
            && let Some(oldest) = pending
                .iter()
                .min_by_key(|(_, t)| **t)
                .map(|(k, _)| k.clone())
        {
            pending.remove(&oldest);
        }
        pending.insert(digest_of(&token), now);
        Ok(token)
    }

    /// Spend a one-time token: a new session id, or `None` when the token is unknown,
    /// used or expired.
    pub fn redeem(&self, token: &str) -> Option<String> {
        let issued = {
            let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
            pending.remove(&digest_of(token))?
        };
        if issued.elapsed() >= LOGIN_TOKEN_TTL {
            return None;
        }
        let session = random_secret().ok()?;
        let mut sessions = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        sessions.retain(|_, seen| now.duration_since(*seen) < SESSION_IDLE);
        if sessions.len() >= MAX_SESSIONS
            && let Some(oldest) = sessions
                .iter()
                .min_by_key(|(_, t)| **t)
                .map(|(k, _)| k.clone())
        {
            sessions.remove(&oldest);
        }
        sessions.insert(digest_of(&session), now);
        Some(session)
    }

    /// Whether `session` is a live session; refreshes its idle timer.
    pub fn check(&self, session: &str) -> bool {
        let mut sessions = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        match sessions.get_mut(&digest_of(session)) {
            Some(seen) if seen.elapsed() < SESSION_IDLE => {
                *seen = Instant::now();
                true
            }
            _ => false,
        }
    }

    pub fn end(&self, session: &str) {
        let mut sessions = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        sessions.remove(&digest_of(session));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_login_token_works_once() {
        let logins = WebLogins::default();
        let token = logins.issue().expect("token");
        let session = logins.redeem(&token).expect("first use");
        assert!(logins.check(&session));
        assert!(logins.redeem(&token).is_none(), "second use must fail");
        assert!(logins.redeem("nonsense").is_none());
        assert!(!logins.check("nonsense"));
        logins.end(&session);
        assert!(!logins.check(&session));
    }
}
