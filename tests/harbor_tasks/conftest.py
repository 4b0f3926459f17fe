# Harbor task folders, run by the tests through the harness: their own tests run only in their verifier.
collect_ignore_glob = ["*"]
