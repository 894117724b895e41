"""What a hostile agent tries (stdlib only): read planted host files, write outside the
workdir, see host processes, open TCP connections, reach the session API or another
session through the relay. Prints one JSON object of outcomes; argv[1] is a JSON config."""

import http.client
import json
import os
import socket
import sys

cfg = json.loads(sys.argv[1])
out = {"read": {}, "write": {}, "tcp": {}, "http": {}}
for path in cfg["read"]:
    try:
        with open(path, "rb") as f:
            out["read"][path] = "READ:" + f.read(100).decode(errors="replace")
    except OSError as exc:
        out["read"][path] = type(exc).__name__
for path in cfg["write"]:
    try:
        with open(path, "w") as f:
            f.write("pwned")
        out["write"][path] = "WROTE"
    except OSError as exc:
        out["write"][path] = type(exc).__name__
cmdlines = []
for pid in os.listdir("/proc"):
    if pid.isdigit():
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdlines.append(f.read().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:
            pass
out["procs"] = cmdlines
for host, port in cfg["tcp"]:
    s = socket.socket()
    s.settimeout(3)
    try:
        s.connect((host, port))
        out["tcp"][f"{host}:{port}"] = "CONNECTED"
    except OSError as exc:
        out["tcp"][f"{host}:{port}"] = type(exc).__name__
    finally:
        s.close()
for name, (method, path, secret) in cfg["http"].items():
    c = http.client.HTTPConnection("127.0.0.1", cfg["port"], timeout=10)
    try:
        headers = {"Authorization": f"Bearer {secret}", "Content-Type": "application/json"}
        body = b"{}" if method == "POST" else None
        c.request(method, path, body=body, headers=headers)
        out["http"][name] = c.getresponse().status
    except OSError as exc:
        out["http"][name] = type(exc).__name__
    finally:
        c.close()
print(json.dumps(out))
