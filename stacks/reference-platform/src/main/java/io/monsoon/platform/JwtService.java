package io.monsoon.platform;

import com.auth0.jwt.JWT;
import com.auth0.jwt.JWTVerifier;
import com.auth0.jwt.algorithms.Algorithm;
import com.auth0.jwt.exceptions.JWTVerificationException;
import com.auth0.jwt.exceptions.TokenExpiredException;
import com.auth0.jwt.interfaces.DecodedJWT;

import java.nio.charset.StandardCharsets;
import java.util.Date;
import java.util.List;
import java.util.UUID;

/** ThingsBoard-style JWT pair (HS512): an access token with scopes [TENANT_ADMIN] and a refresh token. */
final class JwtService {
    static final String ISSUER = "thingsboard.io";
    private final Config cfg;
    private final Algorithm alg;
    private final JWTVerifier verifier;
    final UUID userId;
    final UUID tenantId;

    JwtService(Config cfg) {
        this.cfg = cfg;
        this.alg = Algorithm.HMAC512(cfg.jwtSigningKey.getBytes(StandardCharsets.UTF_8));
        this.verifier = JWT.require(alg).withIssuer(ISSUER).acceptLeeway(0).build();
        this.userId = UUID.nameUUIDFromBytes(("user:" + cfg.adminUsername).getBytes(StandardCharsets.UTF_8));
        this.tenantId = UUID.nameUUIDFromBytes(("tenant:" + cfg.adminUsername).getBytes(StandardCharsets.UTF_8));
    }

    boolean checkPassword(String username, String password) {
        return cfg.adminUsername.equals(username) && cfg.adminPassword.equals(password);
    }

    String[] issuePair(String username) {
        long now = System.currentTimeMillis();
        String token = JWT.create()
            .withSubject(username)
            .withClaim("userId", userId.toString())
            .withClaim("scopes", List.of("TENANT_ADMIN"))
            .withClaim("sessionId", UUID.randomUUID().toString())
            .withClaim("enabled", true)
            .withClaim("isPublic", false)
            .withClaim("tenantId", tenantId.toString())
            .withClaim("customerId", DeviceService.NULL_UUID.toString())
            .withIssuer(ISSUER)
            .withIssuedAt(new Date(now))
            .withExpiresAt(new Date(now + cfg.jwtExpirationSec * 1000))
            .sign(alg);
        String refresh = JWT.create()
            .withSubject(username)
            .withClaim("userId", userId.toString())
            .withClaim("scopes", List.of("REFRESH_TOKEN"))
            .withClaim("isPublic", false)
            .withJWTId(UUID.randomUUID().toString())
            .withIssuer(ISSUER)
            .withIssuedAt(new Date(now))
            .withExpiresAt(new Date(now + cfg.jwtRefreshExpirationSec * 1000))
            .sign(alg);
        return new String[]{token, refresh};
    }

    /** Verifies a token carrying the given scope; ApiException 401 (code 11 expired, 10 otherwise) if not. */
    DecodedJWT verify(String token, String scope) {
        DecodedJWT jwt;
        try {
            jwt = verifier.verify(token);
        } catch (TokenExpiredException e) {
            throw new ApiException(401, ApiException.JWT_TOKEN_EXPIRED, "Token has expired");
        } catch (JWTVerificationException e) {
            throw new ApiException(401, ApiException.AUTHENTICATION, "Authentication failed");
        }
        List<String> scopes = jwt.getClaim("scopes").asList(String.class);
        if (scopes == null || !scopes.contains(scope)) {
            throw new ApiException(401, ApiException.AUTHENTICATION, "Authentication failed");
        }
        return jwt;
    }
}
