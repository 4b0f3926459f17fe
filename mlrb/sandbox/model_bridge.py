"""The model connection inside a confined sandbox: listens on the sandbox's own loopback and
carries each connection to the run's metering proxy (mlrb/models/proxy.py) through the unix socket
the sandbox mounts, its only way out. Agents inside use it as their API's base URL
(http://127.0.0.1:PORT/anthropic, .../openai/v1), with the run's token as their key.

    python -I -S model_bridge.py SOCKET PORT

Standard library only, started in the background when the sandbox starts; it prints
"ready" once it listens. The agent can stop it, which cuts off only its own model calls.
"""

import socket
import sys
import threading


def pipe(source: socket.socket, target: socket.socket) -> None:
    """Copy bytes one way until either side closes, then close both ways of `target`'s writing."""
    try:
        while data := source.recv(65536):
            target.sendall(data)
    except OSError:
        pass
    finally:
        try:
            target.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def carry(client: socket.socket, path: str) -> None:
    upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        upstream.connect(path)
    except OSError:
        client.close()
        upstream.close()
        return
    back = threading.Thread(target=pipe, args=(upstream, client), daemon=True)
    back.start()
    pipe(client, upstream)
    back.join()
    client.close()
    upstream.close()


def main(path: str, port: int) -> None:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(64)
    print("ready", flush=True)
    while True:
        client, _ = listener.accept()
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=carry, args=(client, path), daemon=True).start()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
