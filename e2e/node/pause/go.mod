module pagoda.local/e2e/node/pause

go 1.22
