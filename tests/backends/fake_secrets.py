"""The fake AWS secrets of the redaction tests (a temporary STS credential and a projected
service-account token), and the check that a text holds none of them."""

STS_ACCESS_KEY = "ASIAFAKESTS0000000001"
STS_SECRET = "fakeStsSecret/K7MDENG+bPxRfiCYsecret0001"
STS_TOKEN = "IQoJb3JpZ2luX2VjFAKESTSsessionToken/with+plus/0001=="
# JWT-shaped, as an EKS projected service-account token is.
WEB_IDENTITY_TOKEN = ("eyJhbGciOiJSUzI1NiIsImtpZCI6ImZha2Uta2lkIn0."
                      "eyJzdWIiOiJzeXN0ZW06c2VydmljZWFjY291bnQ6bW9uOnByb21hY2NlbCJ9."
                      "ZmFrZS1zaWduYXR1cmUtMDAwMS1mYWtlLXNpZ25hdHVyZQ")
SECRETS = (STS_SECRET, STS_TOKEN, WEB_IDENTITY_TOKEN)


def leaks(text: str) -> list[str]:
    return [name for name, s in zip(("secret access key", "session token", "web identity token"), SECRETS)
            if s in text]
