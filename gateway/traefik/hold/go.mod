module pagoda.dev/hold

go 1.26.0
