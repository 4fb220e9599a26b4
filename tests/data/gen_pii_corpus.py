#!/usr/bin/env python3
"""Generates tests/data/pii_corpus.jsonl: a labelled corpus for the PII engine.

Each line is {"text": ..., "kind": LABEL or null, "value": exact PII substring or null}.
Positives hold exactly one PII value; negatives hold none, and are mostly
near-misses (numbers that look like PII but are not). Values with checksums
(cards, IBANs) are generated valid for positives and invalid for negatives.

Deterministic: `python3 tests/data/gen_pii_corpus.py > tests/data/pii_corpus.jsonl`.
"""

import base64
import json
import random
import string

R = random.Random(20240305)


def pick(xs):
    return R.choice(xs)


def digits(n):
    return "".join(R.choice(string.digits) for _ in range(n))


def alnum(n, alphabet=string.ascii_letters + string.digits):
    return "".join(R.choice(alphabet) for _ in range(n))


# --------------------------------------------------------------------------
# Checksums


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


def luhn_ok(number):
    return luhn_digit(number[:-1]) == number[-1]


def iban_check(cc, bban):
    s = bban + cc + "00"
    n = int("".join(str(int(c, 36)) for c in s))
    return "%02d" % (98 - n % 97)


def group4(s):
    return " ".join(s[i:i + 4] for i in range(0, len(s), 4))


# --------------------------------------------------------------------------
# Generators of PII values

FIRST = ["jane", "john", "maria", "li", "ahmed", "sofia", "lukas", "emma", "noah", "aiko", "olga",
         "pierre", "fatima", "diego", "chloe", "raj", "anna", "tom", "zoe", "kwame"]
LAST = ["doe", "smith", "garcia", "wang", "khan", "rossi", "muller", "brown", "tanaka", "ivanova",
        "dupont", "haddad", "lopez", "martin", "patel", "nowak", "obrien", "silva", "kim", "mensah"]
DOMAINS = ["example.com", "gmail.com", "outlook.com", "company.co.uk", "mail.example.org", "uni-bonn.de",
           "startup.io", "proton.me", "example.fr", "sub.dept.example.net", "yahoo.co.jp", "web.de"]


def email():
    f, l = pick(FIRST), pick(LAST)
    local = pick([f"{f}.{l}", f"{f}{l}", f"{f[0]}{l}", f"{f}_{l}", f"{f}.{l}{R.randint(1, 99)}",
                  f"{f}+newsletter", f"{f.capitalize()}.{l.capitalize()}", f"{f}-{l}", f"o'{l}"])
    return f"{local}@{pick(DOMAINS)}"


def phone():
    a = str(R.randint(2, 9)) + digits(2)
    x = str(R.randint(2, 9)) + digits(2)
    line = digits(4)
    forms = [
        f"+1 {a} {x} {line}", f"+1-{a}-{x}-{line}", f"+1 ({a}) {x}-{line}", f"({a}) {x}-{line}",
        f"{a}-{x}-{line}", f"{a}.{x}.{line}", f"1-800-{x}-{line}",
        f"+44 20 {digits(4)} {digits(4)}", f"+44 7700 {digits(6)}", f"020 {digits(4)} {digits(4)}",
        f"0161 {digits(3)} {digits(4)}", f"07700 {digits(6)}", f"+44 (0)20 {digits(4)} {digits(4)}",
        f"+33 1 {digits(2)} {digits(2)} {digits(2)} {digits(2)}",
        f"+33 6 {digits(2)} {digits(2)} {digits(2)} {digits(2)}",
        f"06 {digits(2)} {digits(2)} {digits(2)} {digits(2)}", f"01.{digits(2)}.{digits(2)}.{digits(2)}.{digits(2)}",
        f"+49 30 {digits(7)}", f"+49 89 {digits(8)}", f"030 {digits(7)}", f"(089) {digits(8)}",
        f"+34 {R.randint(6, 9)}{digits(2)} {digits(3)} {digits(3)}", f"+39 06 {digits(4)} {digits(4)}",
        f"+91 {R.randint(7, 9)}{digits(4)} {digits(5)}", f"+61 2 {digits(4)} {digits(4)}",
        f"(02) {digits(4)} {digits(4)}", f"0412 {digits(3)} {digits(3)}",
        f"+81 3-{digits(4)}-{digits(4)}", f"03-{digits(4)}-{digits(4)}", f"+353 1 {digits(3)} {digits(4)}",
        f"+31 6 {digits(8)}", f"+4420{digits(8)}", f"+1{a}{x}{line}",
    ]
    return pick(forms)


def card():
    kind = pick(["visa", "visa", "mc", "mc2", "amex", "disc", "jcb", "diners"])
    if kind == "visa":
        body = "4" + digits(14)
    elif kind == "mc":
        body = "5" + str(R.randint(1, 5)) + digits(13)
    elif kind == "mc2":
        body = str(R.randint(2221, 2720)) + digits(11)
    elif kind == "amex":
        body = pick(["34", "37"]) + digits(12)
    elif kind == "disc":
        body = "6011" + digits(11)
    elif kind == "jcb":
        body = "35" + str(R.randint(28, 89)) + digits(11)
    else:
        body = pick(["36", "38"]) + digits(11)
    n = body + luhn_digit(body)
    return fmt_card(n), n


def fmt_card(n):
    style = pick(["plain", "space", "dash"])
    if style == "plain":
        return n
    sep = " " if style == "space" else "-"
    if len(n) == 15:
        groups = [n[:4], n[4:10], n[10:]]
    elif len(n) == 14:
        groups = [n[:4], n[4:10], n[10:]]
    else:
        groups = [n[i:i + 4] for i in range(0, len(n), 4)]
    return sep.join(groups)


IBAN_FORMATS = {  # country: BBAN layout (a = alpha, n = digit, c = alnum)
    "GB": "aaaannnnnnnnnnnnnn", "DE": "nnnnnnnnnnnnnnnnnn", "FR": "nnnnnnnnnncccccccccccnn",
    "NL": "aaaannnnnnnnnn", "BE": "nnnnnnnnnnnn", "ES": "nnnnnnnnnnnnnnnnnnnn",
    "IT": "annnnnnnnnncccccccccccc", "CH": "nnnnncccccccccccc", "AT": "nnnnnnnnnnnnnnnn",
    "PL": "nnnnnnnnnnnnnnnnnnnnnnnn", "IE": "aaaannnnnnnnnnnnnn", "PT": "nnnnnnnnnnnnnnnnnnnnn",
    "NO": "nnnnnnnnnnn", "SE": "nnnnnnnnnnnnnnnnnnnn", "DK": "nnnnnnnnnnnnnn", "FI": "nnnnnnnnnnnnnn",
    "LU": "nnnccccccccccccc", "SA": "nncccccccccccccccccn", "AE": "nnnnnnnnnnnnnnnnnnn",
    "TR": "nnnnnncccccccccccccccc", "BR": "nnnnnnnnnnnnnnnnnnnnnnnac",
}


IBAN_LENGTHS = {"GB": 22, "DE": 22, "FR": 27, "NL": 18, "BE": 16, "ES": 24, "IT": 27, "CH": 21, "AT": 20,
                "PL": 28, "IE": 22, "PT": 25, "NO": 15, "SE": 24, "DK": 18, "FI": 18, "LU": 20, "SA": 24,
                "AE": 23, "TR": 26, "BR": 29}
for _cc, _layout in IBAN_FORMATS.items():
    assert len(_layout) + 4 == IBAN_LENGTHS[_cc], (_cc, len(_layout) + 4)


def bban(layout):
    out = []
    for c in layout:
        if c == "a":
            out.append(R.choice(string.ascii_uppercase))
        elif c == "n":
            out.append(R.choice(string.digits))
        else:
            out.append(R.choice(string.ascii_uppercase + string.digits))
    return "".join(out)


def iban(valid=True):
    cc = pick(sorted(IBAN_FORMATS))
    b = bban(IBAN_FORMATS[cc])
    check = iban_check(cc, b)
    if not valid:
        check = "%02d" % ((int(check) + R.randint(1, 90)) % 97 + 2)
        if check == iban_check(cc, b):
            check = "%02d" % ((int(check) + 1) % 98)
    compact = cc + check + b
    return group4(compact) if R.random() < 0.65 else compact


def ssn():
    while True:
        area = R.randint(1, 899)
        if area != 666:
            break
    return "%03d-%02d-%04d" % (area, R.randint(1, 99), R.randint(1, 9999))


def ipv4():
    return pick([
        f"192.168.{R.randint(0, 255)}.{R.randint(1, 254)}", f"10.{R.randint(0, 255)}.{R.randint(0, 255)}.{R.randint(1, 254)}",
        f"172.{R.randint(16, 31)}.{R.randint(0, 255)}.{R.randint(1, 254)}",
        f"{R.randint(1, 223)}.{R.randint(0, 255)}.{R.randint(0, 255)}.{R.randint(1, 254)}",
        "8.8.8.8", "1.1.1.1", f"203.0.113.{R.randint(1, 254)}", f"198.51.100.{R.randint(1, 254)}",
    ])


def h4():
    return "%x" % R.randint(0, 0xFFFF)


def ipv6():
    return pick([
        f"2001:db8::{h4()}", f"2001:db8:{h4()}:{h4()}::{h4()}", f"fe80::{h4()}:{h4()}:{h4()}:{h4()}",
        "::1", f"2001:0db8:85a3:0000:0000:8a2e:0370:{R.randint(0x1000, 0xffff):04x}",
        f"2a00:1450:4001:{h4()}::200e", f"2606:4700:4700::{pick(['1111', '1001', '64'])}",
        f"::ffff:192.0.2.{R.randint(1, 254)}", f"fd00:{h4()}:{h4()}::{h4()}",
        ":".join(h4() for _ in range(8)),
    ])


def mac():
    octets = [R.randint(0, 255) for _ in range(6)]
    style = pick(["lc", "uc", "dash"])
    if style == "lc":
        return ":".join("%02x" % o for o in octets)
    if style == "uc":
        return ":".join("%02X" % o for o in octets)
    return "-".join("%02X" % o for o in octets)


def aws():
    return pick(["AKIA", "AKIA", "ASIA"]) + alnum(16, string.ascii_uppercase + "234567")


def github():
    if R.random() < 0.75:
        return pick(["ghp_", "gho_", "ghu_", "ghs_", "ghr_"]) + alnum(36)
    return "github_pat_11" + alnum(20, string.ascii_uppercase + string.digits) + "_" + alnum(59)


def api_key():
    r = R.random()
    if r < 0.45:
        return "sk-" + alnum(48)
    if r < 0.85:
        return "sk-proj-" + alnum(R.randint(60, 120), string.ascii_letters + string.digits + "-_")
    return "sk-ant-api03-" + alnum(80, string.ascii_letters + string.digits + "-_")


def b64url(obj):
    raw = json.dumps(obj, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def jwt():
    header = b64url({"alg": pick(["HS256", "RS256", "ES256"]), "typ": "JWT"})
    payload = b64url({"sub": digits(8), "name": pick(FIRST).capitalize(), "iat": 1700000000 + R.randint(0, 9999999)})
    sig = base64.urlsafe_b64encode(R.randbytes(pick([32, 64]))).decode().rstrip("=")
    return f"{header}.{payload}.{sig}"


def pem():
    label = pick(["RSA PRIVATE KEY", "PRIVATE KEY", "EC PRIVATE KEY", "OPENSSH PRIVATE KEY", "ENCRYPTED PRIVATE KEY"])
    body = base64.b64encode(R.randbytes(R.randint(90, 300))).decode()
    lines = [body[i:i + 64] for i in range(0, len(body), 64)]
    return f"-----BEGIN {label}-----\n" + "\n".join(lines) + f"\n-----END {label}-----"


# --------------------------------------------------------------------------
# Positive contexts

GENERIC = [
    "{v}", "Here it is: {v}", "my details -> {v}", "({v})", "\"{v}\"", "'{v}'", "[{v}]",
    "value={v}", "{{\"field\": \"{v}\"}}", "- {v}\n- nothing else", "> {v}", "**{v}**", "`{v}`",
    "Please use {v} from now on.", "I think it was {v}, not sure.", "Copied from the form: {v};",
]

CONTEXTS = {
    "EMAIL": ["Contact me at {v} when you can.", "Send the invoice to {v}.", "From: Jane <{v}>",
              "reply-to: {v}", "Mon adresse est {v}, merci.", "Meine E-Mail: {v}", "mailto:{v}",
              "user={v} action=login status=ok", "{{\"email\": \"{v}\", \"plan\": \"pro\"}}",
              "name,email\nJane,{v}", "cc {v} please", "メール：{v} までご連絡ください"],
    "PHONE": ["Call me on {v} after 6pm.", "Tel: {v}", "Phone: {v} (mobile)", "You can reach the office at {v}.",
              "Appelez-moi au {v} demain.", "Rufen Sie {v} an.", "emergency contact {v}",
              "{{\"phone\": \"{v}\"}}", "text {v} if late", "Telefono: {v}", "My number is {v}, thanks!"],
    "CREDIT_CARD": ["My card number is {v}, exp 09/27.", "card: {v}", "Charge {v} for the renewal.",
                    "Visa {v} was declined", "Número de tarjeta: {v}", "cc_number={v}",
                    "Please refund to {v} instead.", "{{\"pan\": \"{v}\"}}"],
    "IBAN": ["My IBAN is {v}.", "IBAN: {v}", "Please wire it to {v} by Friday.", "Meine IBAN lautet {v}.",
             "Virement sur le compte {v} svp", "Bank details - IBAN {v} - BIC DEUTDEFF",
             "iban={v}", "Account {v} (personal)"],
    "SSN": ["My SSN is {v}.", "SSN: {v}", "social security number {v}", "ssn={v}",
            "Applicant SSN {v} on file", "Enter {v} in box 3"],
    "IPV4": ["Connection from {v} refused", "ssh into {v} and restart nginx",
             "client_ip={v} status=403", "The printer is at {v}.", "curl http://{v}:8080/health",
             "ping {v}", "allow from {v}/32", "X-Forwarded-For: {v}"],
    "IPV6": ["Connection from {v} refused", "client_ip={v}", "listen [{v}]:443;", "ping6 {v}",
             "The router's address is {v}.", "AAAA record -> {v}"],
    "MAC": ["Device MAC {v} is blocked.", "mac_address={v}", "ether {v}", "Whitelist {v} on the router",
            "hw addr: {v}"],
    "AWS_KEY": ["aws_access_key_id = {v}", "export AWS_ACCESS_KEY_ID={v}", "the key {v} leaked in the logs",
                "AccessKeyId: {v}", "{{\"AccessKeyId\": \"{v}\"}}"],
    "GITHUB_TOKEN": ["GITHUB_TOKEN={v}", "git clone https://{v}@github.com/org/repo.git",
                     "token: {v}", "Authorization: token {v}", "I pasted {v} by mistake"],
    "API_KEY": ["OPENAI_API_KEY={v}", "Authorization: Bearer {v}", "api_key = \"{v}\"",
                "my key is {v} can you check it", "client = OpenAI(api_key=\"{v}\")"],
    "JWT": ["Authorization: Bearer {v}", "token={v}", "Cookie: session={v}; Path=/",
            "Here's the JWT: {v}", "{{\"id_token\": \"{v}\"}}"],
    "PRIVATE_KEY": ["Here is the key:\n{v}\nKeep it safe.", "{v}", "id_rsa:\n\n{v}\n",
                    "```\n{v}\n```", "Can you check why this fails?\n{v}\nThanks"],
}

GEN = {"EMAIL": email, "PHONE": phone, "CREDIT_CARD": lambda: card()[0], "IBAN": iban, "SSN": ssn,
       "IPV4": ipv4, "IPV6": ipv6, "MAC": mac, "AWS_KEY": aws, "GITHUB_TOKEN": github,
       "API_KEY": api_key, "JWT": jwt, "PRIVATE_KEY": pem}

COUNTS = {"EMAIL": 36, "PHONE": 60, "CREDIT_CARD": 36, "IBAN": 32, "SSN": 22, "IPV4": 28, "IPV6": 24,
          "MAC": 16, "AWS_KEY": 14, "GITHUB_TOKEN": 14, "API_KEY": 14, "JWT": 12, "PRIVATE_KEY": 10}


def positives():
    out = []
    for kind, n in COUNTS.items():
        for i in range(n):
            v = GEN[kind]()
            ctx = pick(CONTEXTS[kind]) if i % 3 else pick(GENERIC)
            if kind == "PRIVATE_KEY" and ctx in GENERIC and ctx not in ("{v}", "> {v}"):
                ctx = "{v}"
            out.append({"text": ctx.format(v=v), "kind": kind, "value": v})
    # Hand-written classics, as people paste them.
    classics = [
        ("Call +44 20 7946 0958 for the London office.", "PHONE", "+44 20 7946 0958"),
        ("US support: +1-202-555-0143", "PHONE", "+1-202-555-0143"),
        ("Paris: +33 1 23 45 67 89", "PHONE", "+33 1 23 45 67 89"),
        ("Berlin +49 30 1234567", "PHONE", "+49 30 1234567"),
        ("Office (202) 555-0143, ask for Ann", "PHONE", "(202) 555-0143"),
        ("202.555.0143 is the fax", "PHONE", "202.555.0143"),
        ("Ring 020 7946 0958 tomorrow", "PHONE", "020 7946 0958"),
        ("Mon portable : 06 12 34 56 78", "PHONE", "06 12 34 56 78"),
        ("Test card 4111 1111 1111 1111 works in sandbox", "CREDIT_CARD", "4111 1111 1111 1111"),
        ("amex 3782 822463 10005", "CREDIT_CARD", "3782 822463 10005"),
        ("card 5555555555554444 exp 12/26 cvc 123", "CREDIT_CARD", "5555555555554444"),
        ("IBAN GB82 WEST 1234 5698 7654 32", "IBAN", "GB82 WEST 1234 5698 7654 32"),
        ("DE89370400440532013000 is the account", "IBAN", "DE89370400440532013000"),
        ("FR14 2004 1010 0505 0001 3M02 606", "IBAN", "FR14 2004 1010 0505 0001 3M02 606"),
        ("NL91 ABNA 0417 1643 00 (ABN AMRO)", "IBAN", "NL91 ABNA 0417 1643 00"),
        ("key AKIAIOSFODNN7EXAMPLE in ~/.aws/credentials", "AWS_KEY", "AKIAIOSFODNN7EXAMPLE"),
        ("jwt eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4gRG9lIiwiaWF0IjoxNTE2MjM5MDIyfQ.SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c",
         "JWT", "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4gRG9lIiwiaWF0IjoxNTE2MjM5MDIyfQ.SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c"),
        ("loopback is ::1 on this box", "IPV6", "::1"),
        ("link-local fe80::1ff:fe23:4567:890a%eth0", "IPV6", "fe80::1ff:fe23:4567:890a"),
        ("gateway 192.168.0.1, DNS auto", "IPV4", "192.168.0.1"),
        ("SSN 078-05-1120 (the Woolworth wallet card)", "SSN", "078-05-1120"),
    ]
    # Harder cases: formats and surroundings met in real chats and logs.
    hard = [
        ("email:JANE.DOE@EXAMPLE.COM", "EMAIL", "JANE.DOE@EXAMPLE.COM"),
        ("ops-team2@eu-west-1.mail.example.com is the alias", "EMAIL", "ops-team2@eu-west-1.mail.example.com"),
        ("jane@example.com's inbox is full", "EMAIL", "jane@example.com"),
        ("Reach me: jane.doe@example.com.", "EMAIL", "jane.doe@example.com"),
        ("<li>kwame.mensah@proton.me</li>", "EMAIL", "kwame.mensah@proton.me"),
        ("+44 7700 900 123 (mobile)", "PHONE", "+44 7700 900 123"),
        ("+1 415-555-2671", "PHONE", "+1 415-555-2671"),
        ("+1.415.555.2671", "PHONE", "+1.415.555.2671"),
        ("(415)555-2671", "PHONE", "(415)555-2671"),
        ("call 415 555 2671 today", "PHONE", "415 555 2671"),
        ("+49 (0)30 1234567", "PHONE", "+49 (0)30 1234567"),
        ("+33 (0)1 23 45 67 89", "PHONE", "+33 (0)1 23 45 67 89"),
        ("tel:+14155552671", "PHONE", "+14155552671"),
        ("+65 6123 4567 (Singapore office)", "PHONE", "+65 6123 4567"),
        ("+852 2123 4567", "PHONE", "+852 2123 4567"),
        ("Moscow: +7 495 123-45-67", "PHONE", "+7 495 123-45-67"),
        ("WhatsApp +55 11 91234-5678", "PHONE", "+55 11 91234-5678"),
        ("+86 138 0013 8000", "PHONE", "+86 138 0013 8000"),
        ("+90 212 123 45 67", "PHONE", "+90 212 123 45 67"),
        ("freephone 0800 123 4567", "PHONE", "0800 123 4567"),
        ("Lyon 04 72 12 34 56", "PHONE", "04 72 12 34 56"),
        ("München 089 1234567", "PHONE", "089 1234567"),
        ("1 (800) 555-0199 toll free", "PHONE", "1 (800) 555-0199"),
        ("+1 202-555-0143 ext. 12", "PHONE", "+1 202-555-0143"),
        ("4111-1111-1111-1111", "CREDIT_CARD", "4111-1111-1111-1111"),
        ("mastercard 5105 1051 0510 5100", "CREDIT_CARD", "5105 1051 0510 5100"),
        ("AMEX 3714 496353 98431", "CREDIT_CARD", "3714 496353 98431"),
        ("JCB 3566 0020 2036 0505", "CREDIT_CARD", "3566 0020 2036 0505"),
        ("new MC range 2223003122003222", "CREDIT_CARD", "2223003122003222"),
        ("card#4242424242424242", "CREDIT_CARD", "4242424242424242"),
        ("IBAN: CH93 0076 2011 6238 5295 7", "IBAN", "CH93 0076 2011 6238 5295 7"),
        ("AT61 1904 3002 3457 3201", "IBAN", "AT61 1904 3002 3457 3201"),
        ("ES91 2100 0418 4502 0005 1332", "IBAN", "ES91 2100 0418 4502 0005 1332"),
        ("IT60 X054 2811 1010 0000 0123 456", "IBAN", "IT60 X054 2811 1010 0000 0123 456"),
        ("IE29 AIBK 9311 5212 3456 78", "IBAN", "IE29 AIBK 9311 5212 3456 78"),
        ("DK50 0040 0440 1162 43.", "IBAN", "DK50 0040 0440 1162 43"),
        ("SSN#: 536-22-8841", "SSN", "536-22-8841"),
        ("SSN:219-09-9999,", "SSN", "219-09-9999"),
        ("Server IP: 52.14.201.7.", "IPV4", "52.14.201.7"),
        ("(192.168.1.1)", "IPV4", "192.168.1.1"),
        ("ip=100.64.0.1;", "IPV4", "100.64.0.1"),
        ("2001:db8:85a3::8a2e:370:7334", "IPV6", "2001:db8:85a3::8a2e:370:7334"),
        ("curl http://[::1]:8080/", "IPV6", "::1"),
        ("2001:DB8::FF00:42:8329", "IPV6", "2001:DB8::FF00:42:8329"),
        ("fe80::a00:27ff:fe4e:66a1%en0", "IPV6", "fe80::a00:27ff:fe4e:66a1"),
        ("3C:22:FB:A1:9E:07", "MAC", "3C:22:FB:A1:9E:07"),
        ("wlan0 b8-27-eb-12-34-56", "MAC", "b8-27-eb-12-34-56"),
        ("AKIA2OGYBAH6STMMNXNN", "AWS_KEY", "AKIA2OGYBAH6STMMNXNN"),
        ("https://api.example.com/cb?token=eyJhbGciOiJIUzI1NiJ9.eyJ1aWQiOjQyfQ.Xf8n2mR1pQ7sT4uV6wY9zA0bC3dE5fG7hJ&x=1",
         "JWT", "eyJhbGciOiJIUzI1NiJ9.eyJ1aWQiOjQyfQ.Xf8n2mR1pQ7sT4uV6wY9zA0bC3dE5fG7hJ"),
        ("{\"private_key\": \"-----BEGIN PRIVATE KEY-----\\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7\\n-----END PRIVATE KEY-----\\n\"}",
         "PRIVATE_KEY", "-----BEGIN PRIVATE KEY-----\\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7\\n-----END PRIVATE KEY-----"),
    ]
    for text, kind, value in classics + hard:
        out.append({"text": text, "kind": kind, "value": value})
    return out


# --------------------------------------------------------------------------
# Negatives


def bad_card():
    _, n = card()
    last = str((int(n[-1]) + R.randint(1, 9)) % 10)
    n = n[:-1] + last
    assert not luhn_ok(n)
    return fmt_card(n)


def negatives():
    texts = []
    # Checksum failures, shaped exactly like the real thing.
    for _ in range(24):
        texts.append(pick(["My card number is {v}.", "card: {v}", "cc_number={v}", "Charge {v} please"]).format(v=bad_card()))
    for _ in range(20):
        texts.append(pick(["My IBAN is {v}.", "IBAN: {v}", "wire to {v}", "iban={v}"]).format(v=iban(valid=False)))
    texts += [
        "Order ORD-2024-000123 shipped today.", "Your order #A-10023-77 is confirmed", "Invoice INV-2023-004512 is overdue",
        "PO 4500012345 approved", "Ticket JIRA-12345 is blocked by JIRA-12001", "Case #00123456 was closed",
        "Reference: REF/2024/03/000981", "Booking code XK7P2Q, seat 14C", "Order number 20240305-000123",
        "Transaction ID 7f3a9c2e-1b4d-4e5f-8a6b-9c0d1e2f3a4b", "order_id=1000234567 status=paid",
        "Upgrade to v1.2.3 before Friday.", "Windows 10.0.19045.2965 build", "Chrome 120.0.6099.109 (Official Build)",
        "Python 3.11.4 and pip 23.1.2", "node v18.17.1, npm 9.6.7", "requires openssl >= 1.1.1w",
        "version 2.4.1.7 of the firmware", "release 4.18.2.1 is out", "Bump lodash from 4.17.20 to 4.17.21",
        "kernel 5.15.0-91-generic", "image nginx:1.25.3-alpine", "go1.21.5 linux/amd64", "semver ^1.2.3 || ~2.0.0",
        "The meeting is on 2024-03-05 at 10:30.", "Due 05/03/2024, paid 03.05.2024", "Born 12/31/1990",
        "Timestamp 2024-03-05T10:30:00Z", "[2024-03-05 10:30:00,123] INFO started", "between 1999-2004",
        "See you at 23:59:59 sharp", "Elapsed 01:23:45.678", "Open 09:00-17:30 Mon-Fri", "ISO week 2024-W09",
        "ISBN 978-3-16-148410-0", "ISBN-13: 9780306406157", "ISBN 0-306-40615-2", "ISSN 2049-3630",
        "UPS tracking 1Z999AA10123456784", "USPS 9400 1000 0000 0000 0000 00", "FedEx tracking 7489 2103 1234",
        "DHL waybill 1234567890", "Royal Mail AB123456789GB",
        "Invalid address 256.1.1.1 in config", "999.10.10.10 is not an IP", "bad ip 1.2.3", "v10.2.0.1 tag",
        "300.300.300.300", "IP must look like a.b.c.d", "10.0.0.256 is out of range",
        "000-12-3456 is not a valid SSN", "666-12-3456 rejected", "912-34-5678 is an ITIN range", "123-00-4567 invalid group",
        "123-45-0000 invalid serial", "Part no. 123-45-67890",
        "sk-short", "use the sk-... prefix for secret keys", "sk-1234567890", "the risk-assessment-framework-for-2024 doc",
        "pip install scikit-learn (sk-learn-is-not-the-package-name)", "task-management-system-roadmap-v2",
        "git commit e3b0c44298fc1c149afbf4c8996fb92427ae41e4", "sha256: e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
        "md5 d41d8cd98f00b204e9800998ecf8427e", "digest sha256:4c2f9d0e6a1b3c5d7e9f1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b1c2d",
        "Request 123e4567-e89b-12d3-a456-426614174000 failed", "UUID 550E8400-E29B-41D4-A716-446655440000",
        "trace_id=4bf92f3577b34da6a3ce929d0e0e4736", "ULID 01ARZ3NDEKTSV4RRFFQ69G5FAV",
        "Total: $1,299.99", "Preis 1.299,99 €", "USD 1,234,567.89", "price 19.99 + 4.99 shipping", "€45.00 per month",
        "ext. 4567", "Call 911", "call 555-0143", "room 1205", "dial 112 in the EU", "PIN 1234", "zip 90210",
        "postcode SW1A 1AA", "+1 vote from me", "+15% year over year", "score 3-1 at half time",
        "@username on Twitter", "email me at john at example dot com", "user@localhost", "foo@bar",
        "icon@2x.png", "npm install lodash@4.17.21", "git@github.com:org/repo.git", "@types/node@20.11.5",
        "decorator @dataclass(frozen=True)", "aa:bb:cc:dd:ee", "ratio 16:9", "a:b:c", "std::vector<int>",
        "Vec::new() and HashMap::with_capacity(16)", "at 12:30:45 today", "IPv6 uses :: for zero runs",
        "AKIA1234", "AKIAEXAMPLE", "ghp_short", "github_pat_", "eyJhbGciOiJIUzI1NiJ9",
        "base64 SGVsbG8gV29ybGQhIFRoaXMgaXMgYSB0ZXN0Lg==", "color #ff00aa", "rgb(255, 0, 170)",
        "-----BEGIN PUBLIC KEY-----\nMIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8AMIIBCgKCAQEAu1SU1LfVLPHCozMxH2Mo\n-----END PUBLIC KEY-----",
        "-----BEGIN CERTIFICATE-----\nMIIDdzCCAl+gAwIBAgIEAgAAuTANBgkqhkiG9w0BAQUFADBaMQswCQYDVQQGEwJJ\n-----END CERTIFICATE-----",
        "Your file should begin with -----BEGIN PRIVATE KEY----- and end with -----END PRIVATE KEY-----.",
        "-----BEGIN PRIVATE KEY-----\n...redacted...\n-----END PRIVATE KEY-----",
        "coordinates 51.5074, -0.1278", "40.7128° N, 74.0060° W", "population 8,045,311,447", "6.022e23 molecules",
        "pi is 3.14159265358979", "HTTP/1.1 200 OK", "localhost:8080", "port 5432", "epoch 1709634600",
        "epoch ms 1709634600123", "created 20240305123456", "build 20240305.1", "sort code 20-00-00",
        "routing 021000021", "account 31926819", "employee id 00482913", "serial SN-4F7K-2291-XQ",
        "matrix 1 2 3 4 5 6 7 8 9", "the years 2019 2020 2021 2022", "scores: 12 15 18 21 24 27",
        "Line 1234, column 56", "page 12 of 345", "1,2,3,4,5,6,7,8,9,10", "0.5 0.25 0.125 0.0625",
        "6 12 34 56 78 is not a phone (no trunk zero)", "12 34 56 78 90", "from 2021-01-01 to 2021-12-31",
        "bitcoin 1A1zP1eP5QGefi2DMPTfTL5SLmv7DivfNa", "ethereum 0x742d35Cc6634C0532925a3b844Bc454e4438f44e",
        "latitude: 48.8566, longitude: 2.3522", "temperature 21.5°C at 14:00", "v2.0.0-rc.1+build.5",
        "CIDR notation like a.b.c.d/nn",
        # Harder near-misses.
        "EAN 5901234123457 on the box", "barcode 4006381333931", "GTIN 00012345600012",
        "OID 1.3.6.1.4.1.311", "snmpget 1.3.6.1.2.1.1.5.0", "aspect 4:3:2", "at 12:34:56:789",
        "Card: **** **** **** 4242", "IBAN: DE** **** **** **** **** 00", "SSN: ***-**-6789", "ssn xxx-xx-1234",
        "phone: +44 20 XXXX XXXX", "OPENAI_API_KEY=sk-XXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXX",
        "GITHUB_TOKEN=ghp_xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx", "aws_access_key_id = AKIAXXXXXXXXXXXXXXXX",
        "keys that start with AKIA are long-term credentials", "JWTs always start with eyJ",
        "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQC7vbqajDhA user@host"[:42],
        "Model gpt-4o-2024-08-06 is cheaper", "Call me 2-3 times a week", "ISO 8601: 2024-03-05T10:30:00+01:00",
        "Log: 2024/03/05 10:30:00.123456", "SHA1 da39a3ee5e6b4b0d3255bfef95601890afd80709",
        "iPhone 15 Pro, 256 GB", "Flight LH 454 at 13:05", "Rooms 0402 and 0403", "coordinates: 48.858370, 2.294481",
        "years 1990-2000-2010", "Cisco IOS 15.2(4)M7", "CVE-2024-3094 in xz 5.6.0", "RFC 9110 section 15.5.1",
        "pages 1023-1045", "Lot 2024-0312-A", "Batch #12-3456-7890-12", "HS code 8471.30.0100",
    ]
    # Clean prose of the kind a user writes around PII.
    prose = [
        "Can you summarise the attached report in three bullet points?",
        "The quick brown fox jumps over the lazy dog.",
        "Please translate this paragraph into French and keep the tone formal.",
        "We shipped 3 features in Q1 and plan 5 more for Q2.",
        "Note: the API returns a 429 when you exceed 60 requests per minute.",
        "Merci pour votre réponse rapide, à bientôt !",
        "Das Treffen ist am Montag um 10 Uhr.",
        "I have 2 cats and 1 dog; the dog is 11 years old.",
        "Step 1: open the settings. Step 2: click Save.",
        "Our revenue grew 12% to $4.5M in 2023.",
        "TODO: refactor the parser (see issue 482).",
        "The error says: connection reset by peer.",
        "Use the --verbose flag for more output.",
        "He scored 98 out of 100 on the test.",
        "Read chapters 3-5 before the 14th.",
        "これは個人情報を含まないテキストです。",
        "Ratio of 3:2 works best for photos.",
        "Chapter 7, verse 12.",
        "Meet at gate B12 at 7:45.",
        "The function returns Option<String>.",
    ]
    texts += prose
    # Random long digit runs that fail the card checks, and dates in many formats.
    for _ in range(20):
        while True:
            n = str(R.randint(2, 6)) + digits(R.randint(12, 18))
            if not luhn_ok(n):
                break
        texts.append(pick(["reference {v}", "id={v}", "Order {v} shipped", "tx {v}"]).format(v=n))
    for _ in range(20):
        y, m, d = R.randint(1990, 2030), R.randint(1, 12), R.randint(1, 28)
        texts.append(pick(["on {y}-{m:02d}-{d:02d}", "dated {d:02d}/{m:02d}/{y}", "{d:02d}.{m:02d}.{y}",
                           "{m}/{d}/{y} at {h}:{mi:02d}", "{y}{m:02d}{d:02d}"]).format(
            y=y, m=m, d=d, h=R.randint(0, 23), mi=R.randint(0, 59)))
    for _ in range(12):
        texts.append(pick(["Upgrade to {a}.{b}.{c}", "v{a}.{b}.{c}", "version {a}.{b}.{c}.{d}", "build {a}.{b}.{c}.{d}",
                           "release v{a}.{b}.{c}.{d}"]).format(
            a=R.randint(0, 20), b=R.randint(0, 30), c=R.randint(0, 300), d=R.randint(0, 9999)))
    for _ in range(10):
        texts.append("time {:02d}:{:02d}:{:02d}".format(R.randint(0, 23), R.randint(0, 59), R.randint(0, 59)))
    for _ in range(10):
        texts.append("hash " + "".join(R.choice("0123456789abcdef") for _ in range(pick([32, 40, 64]))))
    for _ in range(10):
        u = "".join(R.choice("0123456789abcdef") for _ in range(32))
        texts.append("id " + "-".join([u[:8], u[8:12], u[12:16], u[16:20], u[20:]]))
    for _ in range(12):
        texts.append(pick(["Order ORD-{y}-{n:06d} is on its way", "invoice INV-{y}-{n:06d}", "RMA {y}/{n:06d}",
                           "ticket #{n} reopened"]).format(y=R.randint(2015, 2025), n=R.randint(1, 999999)))
    for _ in range(10):
        texts.append(pick(["It costs ${a:,}.{c:02d}", "total EUR {a}.{c:02d}", "{a:,} units sold",
                           "budget: £{a:,}"]).format(a=R.randint(1, 9999999), c=R.randint(0, 99)))
    for _ in range(10):
        texts.append(pick(["ext {a}", "press {b} then #", "room {a}, floor {b}", "call {a}-{c:04d}",
                           "code {a} {c:04d}"]).format(a=R.randint(100, 999), b=R.randint(1, 9), c=R.randint(0, 9999)))
    for _ in range(10):
        texts.append(pick([
            "We met {n} customers in {y} and {m} in {z}.",
            "The build took {n} seconds on {m} cores.",
            "Between {y} and {z} the index rose {n} points.",
            "Flight {c}{n} departs at {h}:{mi:02d} from gate {m}.",
        ]).format(n=R.randint(1, 5000), m=R.randint(2, 64), y=R.randint(1990, 2010), z=R.randint(2011, 2025),
                  c=pick(["BA", "LH", "AF", "UA"]), h=R.randint(0, 23), mi=R.randint(0, 59)))
    return [{"text": t, "kind": None, "value": None} for t in texts]


def main():
    rows = positives() + negatives()
    for row in rows:
        if row["kind"] is not None:
            assert row["value"] in row["text"], row
        print(json.dumps(row, ensure_ascii=False))


if __name__ == "__main__":
    main()
