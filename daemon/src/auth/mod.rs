//! Bearer tokens for the HTTP transport: HS256 JWTs signed with a key from ring's
//! secure RNG, kept in `secrets/` (0700) as `http-signing-key` (0600).
//!
//! Tokens are "on" once `alexandria daemon auth token` has minted one (remembered in
//! `secrets/http-auth.json`) or when the daemon runs with `--token-required` /
//! `[http] token_required`. `alexandria daemon auth revoke` draws a new signing key and
//! bumps the generation, so every token minted before is invalid at once.
//! Tokens are never logged, never stored by the daemon, and verified with ring's
//! constant-time HMAC check.

pub mod web;

use std::fs;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Once, RwLock};

use alexandria_proto::Home;
use jsonwebtoken::crypto::{CryptoProvider, JwtSigner, JwtVerifier, KeyUtils};
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use ring::rand::{SecureRandom, SystemRandom};
use serde::{Deserialize, Serialize};

/// The audience every alexandria token names; tokens for anything else are refused.
const AUDIENCE: &str = "alexandria";
const KEY_FILE: &str = "http-signing-key";
const STATE_FILE: &str = "http-auth.json";
const KEY_BYTES: usize = 32;

#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is damaged ({reason}): revoke tokens to draw a new key")]
    Damaged { path: PathBuf, reason: String },
    #[error("the system random number generator failed")]
    Random,
    #[error("cannot sign the token: {0}")]
    Sign(jsonwebtoken::errors::Error),
}

pub mod oauth;

/// What a valid token allows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// `Some(slug)`: only this workspace.
    pub workspace: Option<String>,
    /// Set for access tokens issued by the OAuth server (`remote`); the HTTP layer
    /// checks its issuer and audience against the endpoint.
    pub oauth: Option<OAuthClaims>,
}

impl Grant {
    /// A grant with no limits (tokens off, or an unlimited CLI token).
    pub fn everything() -> Grant {
        Grant {
            workspace: None,
            oauth: None,
        }
    }
}

/// The OAuth part of an access token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OAuthClaims {
    /// The public origin that issued it.
    pub iss: String,
    /// The exact resource URL (`<public>/mcp` or `<public>/mcp/<slug>`).
    pub aud: String,
    pub client_id: String,
    /// Space-separated scopes (`wiki:read`, `wiki:write`).
    pub scope: String,
    /// The grant (consent) it belongs to; revoking the grant kills it.
    pub grant_id: String,
}

impl OAuthClaims {
    pub fn has_scope(&self, scope: &str) -> bool {
        self.scope.split_whitespace().any(|s| s == scope)
    }
}

/// Why a request's credentials were refused (the token itself is never kept).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    Missing,
    Invalid,
    Expired,
}

impl Refusal {
    /// The RFC 6750 error code for `WWW-Authenticate`.
    pub fn error_code(self) -> &'static str {
        match self {
            Refusal::Missing => "",
            Refusal::Invalid | Refusal::Expired => "invalid_token",
        }
    }

    pub fn description(self) -> &'static str {
        match self {
            Refusal::Missing => "a bearer token is required: run `alexandria daemon auth token`",
            Refusal::Invalid => "the token is not valid (revoked, or not issued by this daemon)",
            Refusal::Expired => "the token has expired: mint a new one",
        }
    }
}

#[derive(Debug, Serialize, Deserialize)]
struct Claims {
    aud: String,
    iat: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    exp: Option<u64>,
    /// Workspace limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ws: Option<String>,
    /// Key generation; revocation bumps it.
    #[serde(rename = "gen")]
    generation: u64,
    jti: String,
    /// OAuth access tokens only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    iss: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    sub: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    client_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    scope: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    gid: Option<String>,
}

#[derive(Debug, Default, Clone, Serialize, Deserialize)]
struct State {
    /// Set once a token has been minted: from then on HTTP requires a token.
    tokens_enabled: bool,
    generation: u64,
}

struct Keys {
    state: State,
    encoding: EncodingKey,
    decoding: DecodingKey,
}

/// The daemon's token authority.
pub struct Auth {
    dir: PathBuf,
    /// `--token-required` or `[http] token_required`.
    required_by_config: bool,
    keys: RwLock<Option<Keys>>,
}

/// A minted token, shown to the user once.
#[derive(Debug)]
pub struct Minted {
    pub token: String,
    pub workspace: Option<String>,
    pub expires_at: Option<u64>,
}

impl Auth {
    /// Read the key and state under `secrets/`. Nothing is created until a token is
    /// minted, so a daemon that never uses tokens leaves no key behind.
    pub fn load(home: &Home, required_by_config: bool) -> Result<Auth, AuthError> {
        install_crypto_provider();
        let dir = home.secrets_dir();
        let keys = read_keys(&dir)?;
        Ok(Auth {
            dir,
            required_by_config,
            keys: RwLock::new(keys),
        })
    }

    /// Whether HTTP requests must carry a valid token.
    pub fn tokens_enabled(&self) -> bool {
        self.required_by_config
            || self
                .keys
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .as_ref()
                .is_some_and(|keys| keys.state.tokens_enabled)
    }

    /// Mint a token, optionally limited to one workspace and to `ttl_secs`.
    pub fn mint(
        &self,
        workspace: Option<String>,
        ttl_secs: Option<u64>,
    ) -> Result<Minted, AuthError> {
        let mut guard = self.keys.write().unwrap_or_else(|p| p.into_inner());
        if guard.is_none() {
            *guard = Some(write_keys(&self.dir, &State::default())?);
        }
        let keys = guard.as_mut().expect("keys were just created");
        if !keys.state.tokens_enabled {
            let state = State {
                tokens_enabled: true,
                generation: keys.state.generation,
            };
            write_state(&self.dir, &state)?;
            keys.state = state;
        }
        let now = unix_now();
        let expires_at = ttl_secs.map(|ttl| now.saturating_add(ttl));
        let mut id = [0u8; 16];
        SystemRandom::new()
            .fill(&mut id)
            .map_err(|_| AuthError::Random)?;
        let claims = Claims {
            aud: AUDIENCE.into(),
            iat: now,
            exp: expires_at,
            ws: workspace.clone(),
            generation: keys.state.generation,
            jti: hex(&id),
            iss: None,
            sub: None,
            client_id: None,
            scope: None,
            gid: None,
        };
        let token = jsonwebtoken::encode(&Header::new(Algorithm::HS256), &claims, &keys.encoding)
            .map_err(AuthError::Sign)?;
        Ok(Minted {
            token,
            workspace,
            expires_at,
        })
    }

    /// Sign an OAuth access token living `ttl_secs`. Creates the key if needed but,
    /// unlike `mint`, does not turn tokens on for local HTTP clients.
    pub fn mint_access(&self, claims: &OAuthClaims, ttl_secs: u64) -> Result<String, AuthError> {
        let mut guard = self.keys.write().unwrap_or_else(|p| p.into_inner());
        if guard.is_none() {
            *guard = Some(write_keys(&self.dir, &State::default())?);
        }
        let keys = guard.as_ref().expect("keys were just created");
        let now = unix_now();
        let mut id = [0u8; 16];
        SystemRandom::new()
            .fill(&mut id)
            .map_err(|_| AuthError::Random)?;
        let claims = Claims {
            aud: claims.aud.clone(),
            iat: now,
            exp: Some(now.saturating_add(ttl_secs)),
            ws: None,
            generation: keys.state.generation,
            jti: hex(&id),
            iss: Some(claims.iss.clone()),
            sub: Some(format!("owner@{}", claims.iss)),
            client_id: Some(claims.client_id.clone()),
            scope: Some(claims.scope.clone()),
            gid: Some(claims.grant_id.clone()),
        };
        jsonwebtoken::encode(&Header::new(Algorithm::HS256), &claims, &keys.encoding)
            .map_err(AuthError::Sign)
    }

    /// Invalidate every token minted so far: a new key and the next generation.
    /// Tokens stay required.
    pub fn revoke(&self) -> Result<u64, AuthError> {
        let mut guard = self.keys.write().unwrap_or_else(|p| p.into_inner());
        let previous = guard.as_ref().map_or(0, |keys| keys.state.generation);
        let state = State {
            tokens_enabled: true,
            generation: previous + 1,
        };
        *guard = Some(write_keys(&self.dir, &state)?);
        Ok(state.generation)
    }

    /// Check a bearer token. Signature first (constant time), then claims.
    pub fn verify(&self, token: &str) -> Result<Grant, Refusal> {
        let guard = self.keys.read().unwrap_or_else(|p| p.into_inner());
        let Some(keys) = guard.as_ref() else {
            return Err(Refusal::Invalid);
        };
        let mut validation = Validation::new(Algorithm::HS256);
        // The audience is checked below: ours for CLI tokens, the exact endpoint URL
        // (checked by the HTTP layer) for OAuth ones.
        validation.validate_aud = false;
        validation.set_required_spec_claims(&["aud"]);
        validation.leeway = 5;
        let data = jsonwebtoken::decode::<Claims>(token, &keys.decoding, &validation).map_err(
            |error| match error.kind() {
                ErrorKind::ExpiredSignature => Refusal::Expired,
                _ => Refusal::Invalid,
            },
        )?;
        let claims = data.claims;
        if claims.generation != keys.state.generation {
            return Err(Refusal::Invalid);
        }
        if claims.aud == AUDIENCE {
            return Ok(Grant {
                workspace: claims.ws,
                oauth: None,
            });
        }
        match (
            claims.iss,
            claims.client_id,
            claims.scope,
            claims.gid,
            claims.exp,
        ) {
            (Some(iss), Some(client_id), Some(scope), Some(grant_id), Some(_)) => Ok(Grant {
                workspace: None,
                oauth: Some(OAuthClaims {
                    iss,
                    aud: claims.aud,
                    client_id,
                    scope,
                    grant_id,
                }),
            }),
            _ => Err(Refusal::Invalid),
        }
    }
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn read_keys(dir: &Path) -> Result<Option<Keys>, AuthError> {
    let key_path = dir.join(KEY_FILE);
    let secret = match fs::read(&key_path) {
        Ok(secret) => secret,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(AuthError::Read {
                path: key_path,
                source,
            });
        }
    };
    if secret.len() != KEY_BYTES {
        return Err(AuthError::Damaged {
            path: key_path,
            reason: format!("{} bytes instead of {KEY_BYTES}", secret.len()),
        });
    }
    let state_path = dir.join(STATE_FILE);
    let state = match fs::read(&state_path) {
        Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| AuthError::Damaged {
            path: state_path.clone(),
            reason: e.to_string(),
        })?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => State::default(),
        Err(source) => {
            return Err(AuthError::Read {
                path: state_path,
                source,
            });
        }
    };
    keys_from(&secret, state, &key_path).map(Some)
}

fn keys_from(secret: &[u8], state: State, path: &Path) -> Result<Keys, AuthError> {
    let damaged = |e: jsonwebtoken::errors::Error| AuthError::Damaged {
        path: path.to_path_buf(),
        reason: e.to_string(),
    };
    Ok(Keys {
        state,
        encoding: EncodingKey::from_secret(secret).map_err(damaged)?,
        decoding: DecodingKey::from_secret(secret).map_err(damaged)?,
    })
}

/// Draw a new key, write it and the state, and return them.
fn write_keys(dir: &Path, state: &State) -> Result<Keys, AuthError> {
    let mut secret = [0u8; KEY_BYTES];
    SystemRandom::new()
        .fill(&mut secret)
        .map_err(|_| AuthError::Random)?;
    let key_path = dir.join(KEY_FILE);
    write_private(dir, &key_path, &secret)?;
    write_state(dir, state)?;
    keys_from(&secret, state.clone(), &key_path)
}

fn write_state(dir: &Path, state: &State) -> Result<(), AuthError> {
    let bytes = serde_json::to_vec_pretty(state).expect("the auth state serializes");
    write_private(dir, &dir.join(STATE_FILE), &bytes)
}

/// Write `bytes` to `path` atomically with mode 0600, inside a 0700 directory.
fn write_private(dir: &Path, path: &Path, bytes: &[u8]) -> Result<(), AuthError> {
    let error = |source| AuthError::Write {
        path: path.to_path_buf(),
        source,
    };
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(error)?;
    fs::set_permissions(dir, fs::Permissions::from_mode(0o700)).map_err(error)?;
    let temp = path.with_extension("tmp");
    let _ = fs::remove_file(&temp);
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&temp)
        .map_err(error)?;
    file.write_all(bytes)
        .and_then(|()| file.sync_all())
        .map_err(error)?;
    fs::rename(&temp, path).map_err(error)
}

// jsonwebtoken 12 ships RustCrypto and aws-lc backends only; ring is already our
// RNG, so a provider for the one algorithm we use keeps the build small.

struct RingSigner(ring::hmac::Key);
struct RingVerifier(ring::hmac::Key);

impl jsonwebtoken::signature::Signer<Vec<u8>> for RingSigner {
    fn try_sign(&self, message: &[u8]) -> Result<Vec<u8>, jsonwebtoken::signature::Error> {
        Ok(ring::hmac::sign(&self.0, message).as_ref().to_vec())
    }
}

impl JwtSigner for RingSigner {
    fn algorithm(&self) -> Algorithm {
        Algorithm::HS256
    }
}

impl jsonwebtoken::signature::Verifier<Vec<u8>> for RingVerifier {
    fn verify(
        &self,
        message: &[u8],
        signature: &Vec<u8>,
    ) -> Result<(), jsonwebtoken::signature::Error> {
        // ring's HMAC verification compares in constant time.
        ring::hmac::verify(&self.0, message, signature)
            .map_err(|_| jsonwebtoken::signature::Error::new())
    }
}

impl JwtVerifier for RingVerifier {
    fn algorithm(&self) -> Algorithm {
        Algorithm::HS256
    }
}

fn ring_signer(
    algorithm: &Algorithm,
    key: &EncodingKey,
) -> jsonwebtoken::errors::Result<Box<dyn JwtSigner>> {
    if *algorithm != Algorithm::HS256 {
        return Err(ErrorKind::UnsupportedAlgorithm.into());
    }
    Ok(Box::new(RingSigner(ring::hmac::Key::new(
        ring::hmac::HMAC_SHA256,
        key.as_bytes(),
    ))))
}

fn ring_verifier(
    algorithm: &Algorithm,
    key: &DecodingKey,
) -> jsonwebtoken::errors::Result<Box<dyn JwtVerifier>> {
    if *algorithm != Algorithm::HS256 {
        return Err(ErrorKind::UnsupportedAlgorithm.into());
    }
    Ok(Box::new(RingVerifier(ring::hmac::Key::new(
        ring::hmac::HMAC_SHA256,
        key.try_get_as_bytes()?,
    ))))
}

static RING_PROVIDER: CryptoProvider = CryptoProvider {
    signer_factory: ring_signer,
    verifier_factory: ring_verifier,
    key_utils: KeyUtils::new_unimplemented(),
};

fn install_crypto_provider() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        // Fails only if another provider is installed, which then serves as well.
        let _ = RING_PROVIDER.install_default();
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mint_verify_limit_revoke() {
        let dir = tempfile::tempdir().expect("tempdir");
        let home = Home::new(dir.path());
        let auth = Auth::load(&home, false).expect("load");
        assert!(!auth.tokens_enabled());
        assert_eq!(auth.verify("anything"), Err(Refusal::Invalid));

        let open = auth.mint(None, None).expect("mint");
        let limited = auth.mint(Some("acme".into()), Some(3600)).expect("mint");
        assert!(auth.tokens_enabled());
        assert_eq!(auth.verify(&open.token), Ok(Grant::everything()));
        assert_eq!(
            auth.verify(&limited.token),
            Ok(Grant {
                workspace: Some("acme".into()),
                oauth: None,
            })
        );
        // A flipped signature byte, a token from another key, garbage.
        let mut tampered = open.token.clone();
        let last = tampered.pop().expect("non-empty");
        tampered.push(if last == 'A' { 'B' } else { 'A' });
        assert_eq!(auth.verify(&tampered), Err(Refusal::Invalid));
        assert_eq!(auth.verify("a.b.c"), Err(Refusal::Invalid));

        // Files are private and survive a restart.
        let mode = |name: &str| {
            fs::metadata(home.secrets_dir().join(name))
                .expect("exists")
                .permissions()
                .mode()
                & 0o777
        };
        assert_eq!(mode(KEY_FILE), 0o600);
        assert_eq!(mode(STATE_FILE), 0o600);
        assert_eq!(
            fs::metadata(home.secrets_dir())
                .expect("dir")
                .permissions()
                .mode()
                & 0o777,
            0o700
        );
        let reloaded = Auth::load(&home, false).expect("reload");
        assert!(reloaded.tokens_enabled());
        assert!(reloaded.verify(&open.token).is_ok());

        reloaded.revoke().expect("revoke");
        assert_eq!(reloaded.verify(&open.token), Err(Refusal::Invalid));
        assert_eq!(reloaded.verify(&limited.token), Err(Refusal::Invalid));
        assert!(reloaded.tokens_enabled());
        let fresh = reloaded.mint(None, None).expect("mint");
        assert!(reloaded.verify(&fresh.token).is_ok());
    }

    #[test]
    fn oauth_access_tokens_carry_their_claims_and_do_not_turn_tokens_on() {
        let dir = tempfile::tempdir().expect("tempdir");
        let auth = Auth::load(&Home::new(dir.path()), false).expect("load");
        let claims = OAuthClaims {
            iss: "https://wiki.example.org".into(),
            aud: "https://wiki.example.org/mcp/acme".into(),
            client_id: "c1".into(),
            scope: "wiki:read".into(),
            grant_id: "g1".into(),
        };
        let token = auth.mint_access(&claims, 3600).expect("mint");
        assert!(!auth.tokens_enabled());
        let grant = auth.verify(&token).expect("valid");
        assert_eq!(grant.oauth, Some(claims.clone()));
        assert!(
            grant
                .oauth
                .as_ref()
                .is_some_and(|c| c.has_scope("wiki:read"))
        );
        assert!(
            !grant
                .oauth
                .as_ref()
                .is_some_and(|c| c.has_scope("wiki:write"))
        );
        auth.revoke().expect("revoke");
        assert_eq!(auth.verify(&token), Err(Refusal::Invalid));
    }

    #[test]
    fn expired_tokens_are_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let auth = Auth::load(&Home::new(dir.path()), true).expect("load");
        assert!(auth.tokens_enabled());
        let keys = auth.keys.read().expect("lock");
        assert!(keys.is_none());
        drop(keys);
        auth.mint(None, None).expect("mint creates the key");
        let guard = auth.keys.read().expect("lock");
        let keys = guard.as_ref().expect("keys");
        let claims = Claims {
            aud: AUDIENCE.into(),
            iat: 1,
            exp: Some(2),
            ws: None,
            generation: keys.state.generation,
            jti: "x".into(),
            iss: None,
            sub: None,
            client_id: None,
            scope: None,
            gid: None,
        };
        let token = jsonwebtoken::encode(&Header::new(Algorithm::HS256), &claims, &keys.encoding)
            .expect("encode");
        drop(guard);
        assert_eq!(auth.verify(&token), Err(Refusal::Expired));
    }
}
