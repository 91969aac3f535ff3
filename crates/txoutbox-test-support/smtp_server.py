# A real SMTP server for txoutbox tests: Debian's aiosmtpd (python3-aiosmtpd), run by
# tests/support/src/smtp.rs with /usr/bin/python3. It stores every message it accepts, can be told
# to refuse the next messages with a given reply, and exits by itself when its parent goes away.
#
#   serve: smtp_server.py serve --port P --dir D [--auth USER:PASSWORD] [--lifetime SECONDS]
#          prints "READY <port>" once listening (port 0 picks a free one).
#          D/accepted/*.json  one file per accepted message (EHLO name, envelope, headers,
#                             bodies, raw)
#          D/rejected/*.json  one file per message answered with a scripted failure
#          D/failures/*       scripted replies: each message takes (and deletes) the first file in
#                             name order and answers its content (e.g. "451 4.3.0 try later")
#   parse: smtp_server.py parse FILE   prints FILE (an .eml) as the same JSON on stdout
import argparse
import asyncio
import email
import email.policy
import json
import os
import sys
import time

RECEIVED = 0


def describe(raw, mail_from=None, rcpt_tos=None):
    """The parts of a message a test asserts on, decoded by Python's own e-mail parser."""
    message = email.message_from_bytes(raw, policy=email.policy.default)
    text = message.get_body(preferencelist=("plain",))
    html = message.get_body(preferencelist=("html",))
    return {
        "mail_from": mail_from,
        "rcpt_tos": rcpt_tos or [],
        "headers": [[name, str(value)] for name, value in message.items()],
        "text": text.get_content() if text is not None else None,
        "html": html.get_content() if html is not None else None,
        "raw": raw.decode("utf-8", errors="replace"),
    }


def store(directory, record):
    global RECEIVED
    RECEIVED += 1
    name = "%020d-%06d" % (time.time_ns(), RECEIVED)
    tmp = os.path.join(directory, "." + name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(record, f)
        f.flush()
        os.fsync(f.fileno())
    # A reader sees a whole file or none.
    os.rename(tmp, os.path.join(directory, name + ".json"))


def next_failure(failures):
    for name in sorted(os.listdir(failures)):
        path = os.path.join(failures, name)
        try:
            with open(path, encoding="utf-8") as f:
                reply = f.read().strip()
            os.unlink(path)  # only one message can take a given failure
        except FileNotFoundError:
            continue
        if reply:
            return reply
    return None


class Handler:
    def __init__(self, directory):
        self.accepted = os.path.join(directory, "accepted")
        self.rejected = os.path.join(directory, "rejected")
        self.failures = os.path.join(directory, "failures")
        for d in (self.accepted, self.rejected, self.failures):
            os.makedirs(d, exist_ok=True)

    async def handle_DATA(self, server, session, envelope):
        record = describe(envelope.original_content or envelope.content,
                          envelope.mail_from, list(envelope.rcpt_tos))
        record["ehlo"] = session.host_name  # the client's EHLO (or HELO) argument
        failure = next_failure(self.failures)
        if failure is not None:
            record["reply"] = failure
            store(self.rejected, record)
            return failure
        store(self.accepted, record)
        return "250 2.0.0 Ok: queued as %d" % RECEIVED


def authenticator_for(user, password):
    from aiosmtpd.smtp import AuthResult, LoginPassword

    def authenticate(server, session, envelope, mechanism, auth_data):
        ok = (isinstance(auth_data, LoginPassword)
              and auth_data.login.decode() == user
              and auth_data.password.decode() == password)
        # handled=False: let aiosmtpd answer 535 itself on a refusal.
        return AuthResult(success=ok, handled=False, auth_data=auth_data if ok else None)

    return authenticate


async def watch_parent(parent, deadline):
    # The test process may die without killing us (SIGKILL): never outlive it, nor the deadline.
    while os.getppid() == parent and time.monotonic() < deadline:
        await asyncio.sleep(0.5)
    os._exit(0)


async def serve(args):
    from aiosmtpd.smtp import SMTP

    loop = asyncio.get_running_loop()
    handler = Handler(args.dir)
    options = {}
    if args.auth:
        user, _, password = args.auth.partition(":")
        options = dict(auth_required=True, auth_require_tls=False,
                       authenticator=authenticator_for(user, password))
    server = await loop.create_server(
        lambda: SMTP(handler, hostname="txoutbox-test-smtp", loop=loop, timeout=30, **options),
        host="127.0.0.1", port=args.port, reuse_address=True)
    port = server.sockets[0].getsockname()[1]
    print("READY %d" % port, flush=True)
    await watch_parent(os.getppid(), time.monotonic() + args.lifetime)


def main():
    parser = argparse.ArgumentParser()
    commands = parser.add_subparsers(dest="command", required=True)
    s = commands.add_parser("serve")
    s.add_argument("--port", type=int, default=0)
    s.add_argument("--dir", required=True)
    s.add_argument("--auth")
    s.add_argument("--lifetime", type=float, default=600.0)
    p = commands.add_parser("parse")
    p.add_argument("file")
    args = parser.parse_args()
    if args.command == "parse":
        with open(args.file, "rb") as f:
            json.dump(describe(f.read()), sys.stdout)
        return
    asyncio.run(serve(args))


if __name__ == "__main__":
    main()
