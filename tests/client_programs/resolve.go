// Command resolve asks one DNS server with Go's own resolver (no cgo, standard library only):
//
//	resolve SERVER ip4|srv|ptr NAME
//
// It prints one result a line, each connection it dials on stderr ("dial udp", "dial tcp"),
// and exits 2 with the error when the lookup fails.
package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"time"
)

func main() {
	if len(os.Args) != 4 {
		fmt.Fprintln(os.Stderr, "usage: resolve SERVER ip4|srv|ptr NAME")
		os.Exit(64)
	}
	server, kind, name := os.Args[1], os.Args[2], os.Args[3]
	resolver := &net.Resolver{
		PreferGo: true,
		Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
			fmt.Fprintln(os.Stderr, "dial", network)
			var dialer net.Dialer
			return dialer.DialContext(ctx, network, server)
		},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var lines []string
	var err error
	switch kind {
	case "ip4":
		var ips []net.IP
		ips, err = resolver.LookupIP(ctx, "ip4", name)
		for _, ip := range ips {
			lines = append(lines, ip.String())
		}
	case "srv":
		var records []*net.SRV
		_, records, err = resolver.LookupSRV(ctx, "", "", name)
		for _, srv := range records {
			lines = append(lines, fmt.Sprintf("%d %d %d %s", srv.Priority, srv.Weight, srv.Port, srv.Target))
		}
	case "ptr":
		lines, err = resolver.LookupAddr(ctx, name)
	default:
		err = fmt.Errorf("unknown kind %q: ip4, srv or ptr", kind)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	for _, line := range lines {
		fmt.Println(line)
	}
}
