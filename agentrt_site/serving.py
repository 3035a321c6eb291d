"""What kind of process is loading the settings.

`agentrt_site.asgi` sets `ASGI` before Django reads the settings, so the web
server's process (daphne) gets its PostgreSQL connections from a pool.
Under ASGI Django runs each request's synchronous code on a thread of its
own (asgiref's ThreadSensitiveContext) and keeps database connections per
thread, so persistent connections (CONN_MAX_AGE) are never reused there:
each request opened a new server connection, and left it to the garbage
collector. Workers, the maintenance loop and commands keep persistent
connections. A process whose settings were already loaded when it imported
the ASGI module (a test) is unaffected.
"""

ASGI = False
