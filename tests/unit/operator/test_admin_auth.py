"""AdminAuth, the admin endpoint's token check, as a pure function of the Authorization header:
which headers grant access with and without a token, in the bearer and the Basic scheme."""

from __future__ import annotations

import base64

from hypothesis import given
from hypothesis import strategies as st

from mqd.operator.admin import AdminAuth

TOKEN = "s3cret:with-colon-ü"


def basic(user: str, password: str) -> str:
    """What a browser sends once the user typed a name and the password (RFC 7617)."""
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def test_no_token_lets_everyone_in() -> None:
    """Without a configured token every request passes, whatever it carries."""
    auth = AdminAuth(None)
    for header in (None, "", "Bearer x", "Basic !!"):
        assert auth.allows(header, basic=True) and auth.allows(header, basic=False)
    assert AdminAuth("").allows(None, basic=False)  # an empty token is no token


def test_the_right_bearer_token_in_any_scheme_spelling() -> None:
    """The bearer token passes (scheme case-insensitive, surrounding spaces ignored), also where
    Basic does not count."""
    auth = AdminAuth(TOKEN)
    for header in (f"Bearer {TOKEN}", f"bearer {TOKEN}", f"BEARER {TOKEN}", f"  Bearer   {TOKEN}  "):
        assert auth.allows(header, basic=False), header
        assert auth.allows(header, basic=True), header


def test_basic_auth_takes_the_token_as_password_with_any_user() -> None:
    """HTTP Basic passes with any user name and the token as password (split at the first colon,
    so a colon in the token is kept), but only where Basic counts."""
    auth = AdminAuth(TOKEN)
    for user in ("", "admin", "ops team"):
        header = basic(user, TOKEN)
        assert auth.allows(header, basic=True), user
        assert not auth.allows(header, basic=False), user
    assert auth.allows(basic("admin", TOKEN).replace("Basic", "basic"), basic=True)


def test_missing_wrong_and_malformed_credentials_are_refused() -> None:
    """No header, other schemes, near misses of the token, a password without a user separator and
    broken base64 are all refused."""
    auth = AdminAuth(TOKEN)
    refused = [
        None,
        "",
        "Bearer",
        "Bearer ",
        TOKEN,
        f"Token {TOKEN}",
        f"Bearer {TOKEN}x",
        f"Bearer {TOKEN[:-1]}",
        f"Bearer {TOKEN.upper()}",
        basic("admin", "wrong"),
        basic("admin", TOKEN + "\n"),
        "Basic " + base64.b64encode(TOKEN.encode()).decode(),  # no "user:" part
        "Basic !!not-base64!!",
        "Basic ü",
        f"Basic {TOKEN}",
    ]
    for header in refused:
        assert not auth.allows(header, basic=True), header


@given(st.text(min_size=1), st.text())
def test_only_the_token_itself_passes(token: str, guess: str) -> None:
    """For any token and any guess, a bearer or Basic guess passes exactly when it is the token."""
    auth = AdminAuth(token)
    if guess.strip() == guess:  # the header's surrounding spaces are not part of a bearer token
        assert auth.allows(f"Bearer {guess}", basic=False) == (guess == token)
    assert auth.allows(basic("u", guess), basic=True) == (guess == token)
