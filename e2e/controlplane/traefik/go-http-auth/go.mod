module github.com/abbot/go-http-auth

go 1.26.0

require golang.org/x/crypto v0.56.0

require golang.org/x/net v0.58.0
