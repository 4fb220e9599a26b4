#!/usr/bin/env python3
"""Generates tests/data/pii_formats.jsonl: the formats people really write.

One case a line: {"text", "kind", "value", "shape"}; `kind` is the label of the
one PII value the text holds (`value`, an exact substring) or null for a
near-miss that holds none; `shape` names the format, for reports.

The values come from sources that know nothing of the engine's patterns:

* phone numbers from libphonenumber's metadata (the `phonenumbers` package):
  a valid number per country and line type, randomised and checked with
  `is_valid_number`, then written the ways people write them (its own
  national and international formats, then dashes, dots, slashes,
  parentheses, the trunk prefix in `(0)`, the `00` international prefix,
  E.164 and `tel:` URIs);
* MAC addresses as random octets in colon, dash and dotted (three groups of
  four) notation, in both cases;
* credentials inside URLs (userinfo, query parameters) built from random
  tokens of the known token formats and random passwords;
* JWTs built from JSON headers and payloads, base64url-encoded; the
  near-misses have headers that name no `alg` or are no JSON at all;
* numbers of one kind laid out like another (cards grouped like phone
  numbers, IBANs, SSNs, IPv4 addresses, dotted MACs) and the same numbers
  with a broken checksum or range, which must be reported as nothing.

Deterministic:
`pip install phonenumbers==9.0.43` then
`python3 tests/data/gen_pii_formats.py > tests/data/pii_formats.jsonl`.
"""

import base64
import json
import random
import string

import phonenumbers
from phonenumbers import PhoneNumberFormat, PhoneNumberType

R = random.Random(20261201)
ROWS = []


def pick(xs):
    return R.choice(xs)


def digits(n):
    return "".join(R.choice(string.digits) for _ in range(n))


def alnum(n, alphabet=string.ascii_letters + string.digits):
    return "".join(R.choice(alphabet) for _ in range(n))


def pos(kind, value, text, shape):
    assert value in text, (value, text)
    ROWS.append({"text": text, "kind": kind, "value": value, "shape": shape})


def neg(text, shape):
    ROWS.append({"text": text, "kind": None, "value": None, "shape": shape})


# --------------------------------------------------------------------------
# Phone numbers

# Countries whose numbers are also written in their national form, with the
# separators each one uses there. Countries without a trunk prefix (Spain,
# Portugal, the Nordic countries but Sweden and Finland, Poland, Greece,
# Singapore, Hong Kong, ...) are written internationally only: their bare
# national numbers are indistinguishable from other numbers.
NATIONAL = {
    "US": " -.", "CA": " -.", "GB": " -", "FR": " .-", "DE": " -/", "IT": " .", "NL": " -",
    "BE": " ./", "CH": " ./", "AT": " -/", "IE": " -", "AU": " -", "NZ": " -", "JP": "-",
    "KR": "-", "IN": " -", "CN": " -", "SE": " -", "FI": " -", "TR": " ", "ZA": " -",
    "IL": "-", "RU": " -", "BR": " -", "TW": " -", "PH": " -", "TH": " -", "AE": " -",
    "SA": " -", "HU": " -", "AR": " -",
}
# Countries written internationally only, besides the above.
INTERNATIONAL_ONLY = ["ES", "PT", "DK", "NO", "PL", "GR", "CZ", "SG", "HK", "MX", "NG", "EG", "KZ"]
# Where the trunk prefix is written in parentheses after the country code
# (`+44 (0)20 7946 0958`).
TRUNK_IN_PARENS = {"GB", "DE", "CH", "AT", "NL", "BE", "FR", "IE", "SE", "FI", "AU", "NZ", "ZA"}
# Where people dial out with 00 (and so write 0044 ... for a UK number).
DIAL_00 = {"GB", "FR", "DE", "IT", "NL", "BE", "CH", "AT", "IE", "ES", "PT", "DK", "NO", "PL",
           "GR", "CZ", "SE", "FI", "TR", "HU", "NZ", "IN", "CN", "AE", "SA", "ZA"}

CONTEXT = {
    "phone": ["Call me on {v} after 6pm.", "Tel: {v}", "Phone: {v} (mobile)", "You can reach the office at {v}.",
              "Appelez-moi au {v} demain.", "Rufen Sie mich unter {v} an.", "emergency contact {v}",
              "{{\"phone\": \"{v}\"}}", "text {v} if late", "Telefono: {v}", "My number is {v}, thanks!",
              "Fax: {v}", "| Jane Doe | {v} |", "Mobil {v}", "call {v} or e-mail", "{v}"],
}


def valid_number(region, kind):
    example = phonenumbers.example_number_for_type(region, kind)
    if example is None:
        return None
    national = str(example.national_number)
    for _ in range(40):
        keep = max(2, len(national) - 5)
        candidate = national[:keep] + digits(len(national) - keep)
        n = phonenumbers.parse("+%d%s" % (example.country_code, candidate))
        if phonenumbers.is_valid_number(n) and phonenumbers.number_type(n) in (
                kind, PhoneNumberType.FIXED_LINE_OR_MOBILE):
            return n
    return example


def groups(formatted):
    """The digit groups of a formatted number, in order."""
    out, cur = [], ""
    for c in formatted:
        if c.isdigit():
            cur += c
        elif cur:
            out.append(cur)
            cur = ""
    if cur:
        out.append(cur)
    return out


def phone_forms(region, n):
    """(shape, value) pairs: the ways a number of `region` is written."""
    intl = phonenumbers.format_number(n, PhoneNumberFormat.INTERNATIONAL)
    e164 = phonenumbers.format_number(n, PhoneNumberFormat.E164)
    forms = [("intl", intl), ("e164", e164)]
    body = intl.split(" ", 1)[1]
    cc = intl.split(" ", 1)[0]
    g = groups(body)
    forms.append(("intl-dashes", cc + "-" + "-".join(g)))
    forms.append(("intl-dots", cc + "." + ".".join(g)))
    forms.append(("intl-spaces", cc + " " + " ".join(g)))
    meta = phonenumbers.PhoneMetadata.metadata_for_region(region)
    if region in TRUNK_IN_PARENS:
        forms.append(("intl-trunk", cc + " (0)" + " ".join(g)))
    if region in ("US", "CA"):
        forms.append(("intl-parens", "%s (%s) %s-%s" % (cc, g[0], g[1], g[2])))
    if region in DIAL_00:
        forms.append(("intl-00", "00" + cc[1:] + " " + " ".join(g)))
    if region in NATIONAL:
        nat = phonenumbers.format_number(n, PhoneNumberFormat.NATIONAL)
        forms.append(("national", nat))
        ng = groups(nat)
        # Rewritten with other separators only where the national form
        # starts with its trunk prefix (or is North American): a national
        # number without one (Chinese mobiles, Brazilian numbers) keeps the
        # layout its country uses.
        trunk = nat.lstrip("(")[:1] == (meta.national_prefix or "-")[:1]
        seps = NATIONAL[region] if trunk or region in ("US", "CA") else ""
        if region == "CN" and not trunk:
            seps = "-"
        if region == "CN" and not trunk and len(ng) > 1:
            forms.append(("national-dashes", "-".join(ng)))
            seps = ""
        if "-" in seps and len(ng) > 1:
            forms.append(("national-dashes", "-".join(ng)))
        if "." in seps and len(ng) > 1:
            forms.append(("national-dots", ".".join(ng)))
        if "/" in seps and len(ng) > 1:
            forms.append(("national-slash", ng[0] + "/" + " ".join(ng[1:])))
            forms.append(("national-slash-tight", ng[0] + "/" + "".join(ng[1:])))
        if " " in seps and len(ng) > 2 and not nat.startswith("("):
            forms.append(("national-spaces", " ".join(ng)))
        if seps and len(ng) > 1 and region not in ("RU", "HU", "AR") and not nat.startswith("("):
            forms.append(("national-parens", "(%s) %s" % (ng[0], " ".join(ng[1:]))))
    return forms


def phones():
    regions = list(NATIONAL) + INTERNATIONAL_ONLY
    for region in regions:
        # Every form of the country once, each of a fresh number, fixed-line
        # and mobile in turn.
        fixed = valid_number(region, PhoneNumberType.FIXED_LINE)
        forms = phone_forms(region, fixed)
        for i, (shape, _) in enumerate(forms):
            kind = (PhoneNumberType.FIXED_LINE, PhoneNumberType.MOBILE)[i % 2]
            n = valid_number(region, kind) or valid_number(region, PhoneNumberType.FIXED_LINE)
            line = "fixed" if kind == PhoneNumberType.FIXED_LINE else "mobile"
            for s, value in phone_forms(region, n):
                if s != shape:
                    continue
                text = pick(CONTEXT["phone"]).format(v=value)
                if shape == "e164" and R.random() < 0.3:
                    text = "tel:" + value
                pos("PHONE", value, text, f"phone/{region}/{line}/{shape}")
    # tel: URIs as RFC 3966 writes them.
    for region in ("US", "GB", "DE", "FR", "JP"):
        n = valid_number(region, PhoneNumberType.MOBILE)
        uri = phonenumbers.format_number(n, PhoneNumberFormat.RFC3966)
        value = uri[len("tel:"):]
        pos("PHONE", value, f"<a href=\"{uri}\">call</a>", f"phone/{region}/rfc3966")


def phone_near_misses():
    # Too few or too many digits for any numbering plan.
    for _ in range(6):
        neg(pick(["Call +{c} {a} {b}", "tel +{c}-{a}-{b}"]).format(
            c=R.randint(30, 49), a=digits(2), b=digits(2)), "phone-miss/too-short")
    for _ in range(4):
        neg("ref +44 20 %s %s %s %s" % (digits(4), digits(4), digits(4), digits(3)), "phone-miss/too-long")
    # North American numbers whose area code or exchange cannot start with 0 or 1.
    for _ in range(4):
        # (An area code of 0xx in parentheses is a national trunk number.)
        neg("(1%s) %s-%s" % (digits(2), R.randint(200, 999), digits(4)), "phone-miss/nanp-area")
        neg("%s-%s%s-%s" % (R.randint(200, 999), pick("01"), digits(2), digits(4)), "phone-miss/nanp-exchange")
    # Dates, times, ranges, versions, coordinates, prices, ISBNs written with
    # the same separators.
    for _ in range(6):
        y, m, d = R.randint(1990, 2030), R.randint(1, 12), R.randint(1, 28)
        neg(pick(["on {d:02d}.{m:02d}.{y}", "am {d:02d}/{m:02d}/{y}", "{y}/{m:02d}/{d:02d}",
                  "le {d:02d}-{m:02d}-{y}", "{d:02d} {m:02d} {y}", "{m:02d}/{d:02d}/{y} 10:30",
                  "{y}-{m:02d}-{d:02d} {h:02d}:{mi:02d}:{s:02d}"]).format(
            y=y, m=m, d=d, h=R.randint(0, 23), mi=R.randint(0, 59), s=R.randint(0, 59)), "phone-miss/date")
    neg("open 09:00-17:30, 0-24 in summer", "phone-miss/time")
    neg("pages 0123-0145 of volume 2", "phone-miss/range")
    neg("between 1998-2004 and 2010-2015", "phone-miss/range")
    neg("Windows 10.0.19045.2965", "phone-miss/version")
    neg("coordinates -33.8688, 151.2093", "phone-miss/coordinates")
    neg("Preis 1.234.567,89 EUR", "phone-miss/price")
    neg("ISBN 0-306-40615-2", "phone-miss/isbn")
    neg("ISBN 978-0-306-40615-7", "phone-miss/isbn")
    neg("zip 90210-1234", "phone-miss/zip")
    neg("+3 points and +15% since 2019", "phone-miss/plus")
    neg("ratio 0 12 34", "phone-miss/too-short")
    neg("call 020 794 now", "phone-miss/too-short")
    neg("dial 0800 123", "phone-miss/too-short")
    neg("score 1/2/3/4", "phone-miss/slashes")
    neg("version 0.12.3.45", "phone-miss/version")
    neg("Route 030/12 closed", "phone-miss/too-short")


# --------------------------------------------------------------------------
# MAC addresses


def mac_value(style, upper):
    octets = [R.randint(0, 255) for _ in range(6)]
    if style == "dotted":
        # At least one hex letter, as every address written this way in the
        # wild: all-decimal groups are taken for lot numbers.
        while all(("%02x" % o).isdigit() for o in octets):
            octets = [R.randint(0, 255) for _ in range(6)]
        h = "".join("%02x" % o for o in octets)
        s = ".".join(h[i:i + 4] for i in range(0, 12, 4))
    else:
        sep = ":" if style == "colon" else "-"
        s = sep.join("%02x" % o for o in octets)
    return s.upper() if upper else s


MAC_CONTEXT = ["Device MAC {v} is blocked.", "mac_address={v}", "ether {v}", "Whitelist {v} on the router",
               "hw addr: {v}", "interface Gi0/1, mac {v}", "{v}   dynamic   Gi1/0/12",
               "{{\"mac\": \"{v}\"}}", "Burned-in address is {v} (bia {v2})", "{v}"]


def macs():
    for style in ("colon", "dash", "dotted"):
        for i in range(14):
            v = mac_value(style, upper=i % 2 == 1)
            ctx = pick([c for c in MAC_CONTEXT if "{v2}" not in c])
            pos("MAC", v, ctx.format(v=v), f"mac/{style}/{'upper' if i % 2 else 'lower'}")
    neg("aa:bb:cc:dd:ee is only five groups", "mac-miss/short")
    neg("00:11:22:33:44:55:66 has seven", "mac-miss/long")
    neg("mixed 00:11-22:33-44:55 separators", "mac-miss/mixed")
    neg("aabb.ccdd is two groups", "mac-miss/dotted-short")
    neg("aabb.ccdd.eeff.0011 is four groups", "mac-miss/dotted-long")
    neg("aab.bcc.dde.eff", "mac-miss/dotted-threes")
    neg("gg:hh:ii:jj:kk:ll", "mac-miss/not-hex")
    neg("zzzz.yyyy.xxxx", "mac-miss/not-hex")
    neg("Lot 2024.0312.0001 shipped", "mac-miss/lot-number")
    neg("build 1234.5678.9012", "mac-miss/lot-number")
    neg("file abcd.efgh.ijkl", "mac-miss/not-hex")
    neg("face.bead.cafe.", "mac-miss/words")
    neg("x.aabb.ccdd.eeff", "mac-miss/glued")


# --------------------------------------------------------------------------
# Secrets inside URLs


def github():
    return pick(["ghp_", "gho_", "ghu_", "ghs_", "ghr_"]) + alnum(36)


def api_key():
    return pick(["sk-", "sk-proj-"]) + alnum(48)


def aws():
    return "AKIA" + alnum(16, string.ascii_uppercase + "234567")


def b64url(raw):
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def jwt(header=None):
    if header is None:
        header = {"alg": pick(["HS256", "RS256", "ES256", "PS384", "EdDSA", "HS512"])}
        if R.random() < 0.6:
            header["typ"] = "JWT"
        if R.random() < 0.3:
            header["kid"] = alnum(12)
    h = b64url(json.dumps(header, separators=(",", ":")).encode())
    payload = {"sub": digits(8), "iat": 1700000000 + R.randint(0, 9999999)}
    if R.random() < 0.5:
        payload["email_verified"] = True
    p = b64url(json.dumps(payload, separators=(",", ":")).encode())
    sig = "" if header.get("alg") == "none" else b64url(R.randbytes(pick([32, 48, 64])))
    return f"{h}.{p}.{sig}"


def password():
    return alnum(R.randint(8, 20), string.ascii_letters + string.digits + "!$*-_~.")


HOSTS = ["github.com", "db.internal.example.com", "proxy.example.net:3128", "api.example.com",
         "registry.example.io", "cache-01.example.org:6379"]


def url_secrets():
    for _ in range(8):
        t = github()
        pos("GITHUB_TOKEN", t, pick(["git clone https://{t}@github.com/org/repo.git",
                                     "remote: https://x-access-token:{t}@github.com/org/app",
                                     "url = https://oauth2:{t}@github.com/team/infra.git"]).format(t=t),
            "url/userinfo/github")
    for _ in range(5):
        k = api_key()
        pos("API_KEY", k, "HTTPS_PROXY=https://user:{k}@{h}".format(k=k, h=pick(HOSTS)), "url/userinfo/api-key")
    for _ in range(10):
        pw = password()
        url = pick(["postgres://app:{p}@{h}/orders", "redis://default:{p}@{h}/0",
                    "https://admin:{p}@{h}/dashboard", "amqp://guest:{p}@{h}/vhost",
                    "mongodb+srv://svc_reader:{p}@{h}/db?retryWrites=true",
                    "ftp://jane.doe:{p}@{h}/inbox"]).format(p=pw, h=pick(HOSTS))
        pos("SECRET", pw, pick(["DATABASE_URL={u}", "connect to {u}", "\"url\": \"{u}\"", "{u}"]).format(u=url),
            "url/userinfo/password")
    for _ in range(6):
        t = jwt()
        pos("JWT", t, pick(["https://app.example.com/callback?token={t}&state=xyz",
                            "wss://rt.example.com/socket?access_token={t}",
                            "GET /api/me?jwt={t} HTTP/1.1"]).format(t=t), "url/query/jwt")
    for _ in range(5):
        k = api_key()
        pos("API_KEY", k, "https://api.example.com/v1/models?api_key={k}&limit=5".format(k=k), "url/query/api-key")
    for _ in range(4):
        k = aws()
        pos("AWS_KEY", k, "https://s3.example.com/bucket/f.txt?AWSAccessKeyId={k}&Expires=1700000000".format(k=k),
            "url/query/aws")
    for _ in range(8):
        s = alnum(R.randint(24, 40)) + digits(2)
        name = pick(["password", "token", "access_token", "api_key", "apikey", "client_secret", "sig", "secret"])
        pos("SECRET", s, "https://service.example.com/hook?{n}={s}&format=json".format(n=name, s=s),
            f"url/query/{name}")
    for _ in range(3):
        e = pick(["ann.lee@example.com", "bob+billing@mail.example.org"])
        pos("EMAIL", e, f"https://example.com/unsubscribe?email={e}&list=weekly", "url/query/email")
    pos("EMAIL", "jane@example.com", "https://example.com/users/jane@example.com/profile", "url/path/email")
    pos("EMAIL", "ops@example.com", "<a href=\"mailto:ops@example.com\">mail us</a>", "url/mailto/email")
    # Near-misses: usernames, placeholders, empty values, search terms.
    neg("https://jane@example.com/path", "url-miss/username")
    neg("ssh://git@github.com/org/repo.git", "url-miss/username")
    neg("postgres://user:password@localhost:5432/db", "url-miss/placeholder")
    neg("redis://:${REDIS_PASSWORD}@cache:6379", "url-miss/placeholder")
    neg("https://user:<password>@example.com", "url-miss/placeholder")
    neg("mysql://root:@localhost/test", "url-miss/empty")
    neg("https://example.com/login?token=&next=/", "url-miss/empty")
    neg("https://example.com/search?q=sk-learn+tutorial", "url-miss/search")
    neg("https://example.com/docs?token_type=bearer&page=2", "url-miss/param-name")
    neg("https://example.com/?key=value", "url-miss/short")
    neg("https://example.com/reset?token=XXXXXXXXXXXXXXXXXXXXXXXX", "url-miss/placeholder")
    neg("https://medium.com/@jane/how-to-1234", "url-miss/handle")
    neg("https://example.com/a/b?page=2&sort=desc", "url-miss/plain")


# --------------------------------------------------------------------------
# JWTs


def jwts():
    contexts = ["Authorization: Bearer {v}", "token={v}", "Cookie: session={v}; Path=/", "Here's the JWT: {v}",
                "{{\"id_token\": \"{v}\"}}", "export TOKEN='{v}'", "{v}"]
    for _ in range(16):
        v = jwt()
        pos("JWT", v, pick(contexts).format(v=v), "jwt/signed")
    for _ in range(3):
        v = jwt({"alg": "none", "typ": "JWT"})
        pos("JWT", v, pick(contexts).format(v=v), "jwt/unsecured")
    # Headers that name no alg, or are no JSON: base64url that merely starts with eyJ.
    for header in ({"typ": "JWT"}, {"kid": "k1", "typ": "JWT"}, {"alg": 256}, {"sub": "1234567890"}):
        neg("token=" + jwt(header), "jwt-miss/no-alg")
    for raw in (b'{"al g":"HS256"', b'{"alg" "HS256"}', b'{"typ":"JWT", broken', b'{"\x00\xff\xfe'):
        h = b64url(raw)
        neg(f"Bearer {h}.{b64url(b'{}')}.{b64url(R.randbytes(32))}", "jwt-miss/not-json")
    neg("Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0", "jwt-miss/two-segments")
    neg("JWTs always start with eyJ, e.g. eyJhbGciOi...", "jwt-miss/prose")


# --------------------------------------------------------------------------
# Numbers of one kind written like another


def luhn_digit(body):
    total = 0
    for i, ch in enumerate(reversed(body)):
        d = int(ch)
        if i % 2 == 0:
            d *= 2
            if d > 9:
                d -= 9
        total += d
    return str((10 - total % 10) % 10)


def iban_check(cc, bban):
    s = bban + cc + "00"
    n = int("".join(str(int(c, 36)) for c in s))
    return "%02d" % (98 - n % 97)


def cross_types():
    for _ in range(8):
        body = pick(["4", "51", "52", "55"]) + digits(15 - 1)
        body = body[:15]
        n = body + luhn_digit(body)
        sep = pick([" ", "-"])
        v = sep.join(n[i:i + 4] for i in range(0, 16, 4))
        pos("CREDIT_CARD", v, pick(["Tel? no, card: {v}", "Call {v} to pay", "{v}"]).format(v=v), "cross/card-as-phone")
        bad = n[:-1] + str((int(n[-1]) + R.randint(1, 9)) % 10)
        neg("Call " + sep.join(bad[i:i + 4] for i in range(0, 16, 4)) + " to pay", "cross-miss/card-luhn")
    for _ in range(4):
        body = pick(["34", "37"]) + digits(12)
        n = body + luhn_digit(body)
        v = f"{n[:4]} {n[4:10]} {n[10:]}"
        pos("CREDIT_CARD", v, f"Amex {v} on file", "cross/amex-groups")
    for _ in range(6):
        cc, b = pick([("DE", digits(18)), ("GB", "NWBK" + digits(14)), ("FR", digits(23)), ("NL", "ABNA" + digits(10))])
        check = iban_check(cc, b)
        compact = cc + check + b
        v = " ".join(compact[i:i + 4] for i in range(0, len(compact), 4))
        pos("IBAN", v, f"Konto {v} bitte", "cross/iban-groups")
        wrong = "%02d" % ((int(check) + 1) % 97 + 2)
        if wrong == check:
            wrong = "%02d" % ((int(check) + 2) % 97 + 2)
        bad = cc + wrong + b
        neg("Konto " + " ".join(bad[i:i + 4] for i in range(0, len(bad), 4)) + " bitte", "cross-miss/iban-check")
    for _ in range(6):
        v = "%03d-%02d-%04d" % (R.randint(1, 665), R.randint(1, 99), R.randint(1, 9999))
        pos("SSN", v, pick(["SSN {v}", "call? no: {v} is my SSN", "{v}"]).format(v=v), "cross/ssn-as-phone")
    neg("SSN 000-12-3456 is void", "cross-miss/ssn-area")
    neg("SSN 666-12-3456 is void", "cross-miss/ssn-area")
    neg("ref 123-00-4567", "cross-miss/ssn-group")
    for _ in range(6):
        v = "%d.%d.%d.%d" % (R.randint(1, 223), R.randint(0, 255), R.randint(0, 255), R.randint(1, 254))
        pos("IPV4", v, pick(["host {v} is down", "from {v}:443", "{v}"]).format(v=v), "cross/ipv4-as-phone")
    neg("host 256.12.1.1 is invalid", "cross-miss/ipv4-range")
    neg("host 10.0.0.1.5 is invalid", "cross-miss/ipv4-five")
    for _ in range(4):
        h = "".join(pick("0123456789") for _ in range(10)) + pick("abcdef") + pick("0123456789")
        v = ".".join(h[i:i + 4] for i in range(0, 12, 4))
        pos("MAC", v, f"mac {v} learned", "cross/mac-dotted-digits")
    for _ in range(4):
        v = ":".join("%02d" % R.randint(0, 99) for _ in range(6))
        pos("MAC", v, f"ether {v}", "cross/mac-as-time")
    for _ in range(4):
        v = "2001:db8:%x:%x::%x" % (R.randint(1, 0xffff), R.randint(1, 0xffff), R.randint(1, 0xffff))
        pos("IPV6", v, f"addr {v}/64", "cross/ipv6-not-mac")
    # Phone numbers that look like cards or IBANs by their digit count.
    for region in ("DE", "GB", "IN", "CN"):
        n = valid_number(region, PhoneNumberType.MOBILE)
        v = phonenumbers.format_number(n, PhoneNumberFormat.INTERNATIONAL)
        pos("PHONE", v, f"Handy {v}", f"cross/phone-long/{region}")


def main():
    phones()
    phone_near_misses()
    macs()
    url_secrets()
    jwts()
    cross_types()
    for row in ROWS:
        print(json.dumps(row, ensure_ascii=False))


if __name__ == "__main__":
    main()
