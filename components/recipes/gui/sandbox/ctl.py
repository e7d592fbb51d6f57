"""One browser action per process: send a JSON request to the controller's socket, print the answer.

Runs as `python -S ctl.py SOCKET < request.json` (stdlib only, so `-S` keeps interpreter start-up short);
the request comes on stdin, so no text the policy types meets argv's 128 KiB limit (a request given as one
more argument is still read). `--wait SECONDS` retries the connection while the controller starts.
Exit code 0 = the controller answered (the answer itself says ok or not); 3 = no controller.
"""

import json
import socket
import sys
import time


def main() -> int:
    args = sys.argv[1:]
    wait = 0.0
    if args and args[0] == "--wait":
        wait, args = float(args[1]), args[2:]
    path = args[0]
    request = args[1] if len(args) > 1 else sys.stdin.read()
    deadline = time.monotonic() + wait
    while True:
        try:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(60)
            sock.connect(path)
            break
        except OSError as err:
            sock.close()
            if time.monotonic() >= deadline:
                print(json.dumps({"ok": False, "error": f"browser controller not reachable at {path}: {err}"}))
                return 3
            time.sleep(0.1)
    with sock:
        sock.sendall(request.encode() + b"\n")
        data = b""
        while not data.endswith(b"\n"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    sys.stdout.write(data.decode())
    return 0 if data else 3


if __name__ == "__main__":
    sys.exit(main())
