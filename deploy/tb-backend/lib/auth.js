// Who is asking: a signed JWT, as the app's API issues it, checked with jsonwebtoken. The token's
// `sub` is the user's id (24 hex); `role: "moderator"` also lets a client read crisis alerts. Only
// HS256 is accepted (a token cannot choose its own algorithm, `none` included).
'use strict';

const jwt = require('jsonwebtoken');

const OID = /^[0-9a-fA-F]{24}$/;

class AuthError extends Error {
  constructor(code, message) {
    super(message);
    this.code = code;
  }
}

// The user a token names, or an AuthError that says why not (its message goes to the client).
function verify(token, cfg) {
  if (typeof token !== 'string' || token === '') {
    throw new AuthError('no_token', 'no token: connect with auth.token, the JWT the app\'s API issued');
  }
  let claims;
  try {
    claims = jwt.verify(token, cfg.secret, {
      algorithms: ['HS256'],
      issuer: cfg.issuer,
      audience: cfg.audience,
    });
  } catch (e) {
    if (e.name === 'TokenExpiredError') throw new AuthError('token_expired', `token expired at ${e.expiredAt.toISOString()}`);
    if (e.name === 'NotBeforeError') throw new AuthError('token_not_yet_valid', 'token not valid yet');
    throw new AuthError('token_invalid', `token not valid: ${e.message}`);
  }
  if (typeof claims.sub !== 'string' || !OID.test(claims.sub)) {
    throw new AuthError('token_invalid', 'token not valid: its sub is not a user id');
  }
  if (claims.exp === undefined) throw new AuthError('token_invalid', 'token not valid: it has no expiry');
  return { userId: claims.sub.toLowerCase(), moderator: claims.role === 'moderator' };
}

// Mints a token (the demo and the tests; the app's API does this in production).
function mint(userId, cfg, { expiresIn = '12h', role } = {}) {
  const payload = role ? { role } : {};
  const opts = { algorithm: 'HS256', subject: userId, expiresIn };
  if (cfg.issuer) opts.issuer = cfg.issuer;
  if (cfg.audience) opts.audience = cfg.audience;
  return jwt.sign(payload, cfg.secret, opts);
}

// Socket.IO middleware: a client joins only its own user's room. It may name the user it expects
// (auth.userId); a token for someone else is refused, never quietly switched.
function socketAuth(cfg, log) {
  return (socket, next) => {
    const { token, userId } = socket.handshake.auth || {};
    try {
      const who = verify(token, cfg);
      if (userId !== undefined && String(userId).toLowerCase() !== who.userId) {
        throw new AuthError('wrong_user', 'this token is for another user: a client joins only its own user\'s room');
      }
      socket.data.user = who;
      next();
    } catch (e) {
      if (!(e instanceof AuthError)) return next(e);
      log.warn(`socket refused (${e.code}) from ${socket.handshake.address}: ${e.message}`);
      const err = new Error(e.message);
      err.data = { code: e.code };
      next(err);
    }
  };
}

// Express middleware: `Authorization: Bearer <token>`.
function httpAuth(cfg) {
  return (req, res, next) => {
    const h = req.get('authorization') || '';
    const token = h.startsWith('Bearer ') ? h.slice(7) : '';
    try {
      req.user = verify(token, cfg);
      next();
    } catch (e) {
      if (!(e instanceof AuthError)) return next(e);
      res.status(401).json({ error: e.message, code: e.code });
    }
  };
}

module.exports = { verify, mint, socketAuth, httpAuth, AuthError, OID };
