"""Emberbox kernel client, run once per code step inside the sandbox:
`python3 client.py SOCKET CONNECT_WAIT_SECONDS < request.json`.

Sends the request on stdin to the kernel and prints its JSON answer.
Exit 0: answer printed. Exit 3: the kernel could not be reached within the
wait. Exit 4: the kernel closed the connection without answering (it died).
"""
import socket
import struct
import sys
import time


def main():
    path, wait = sys.argv[1], float(sys.argv[2])
    payload = sys.stdin.buffer.read()
    deadline = time.monotonic() + wait
    while True:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(path)
            break
        except OSError as e:
            s.close()
            if time.monotonic() >= deadline:
                sys.stdout.write('{"kernel_unreachable": %s}' % _json_str(repr(e)))
                return 3
            time.sleep(0.05)
    s.sendall(struct.pack(">Q", len(payload)) + payload)
    buf = bytearray()
    while True:
        chunk = s.recv(1 << 16)
        if not chunk:
            break
        buf += chunk
        if len(buf) >= 8 and len(buf) >= 8 + struct.unpack(">Q", bytes(buf[:8]))[0]:
            break
    if len(buf) < 8 or len(buf) < 8 + struct.unpack(">Q", bytes(buf[:8]))[0]:
        sys.stdout.write('{"kernel_died": true}')
        return 4
    n = struct.unpack(">Q", bytes(buf[:8]))[0]
    sys.stdout.buffer.write(bytes(buf[8:8 + n]))
    return 0


def _json_str(s):
    import json

    return json.dumps(s)


if __name__ == "__main__":
    sys.exit(main())
