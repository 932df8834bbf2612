// Command resolve asks one DNS server with Go's own resolver (no cgo, standard library only):
//
//	resolve SERVER ip4|srv|ptr NAME [COUNT]
//
// It prints one result a line, each connection it dials on stderr ("dial udp", "dial tcp"),
// and exits 2 with the error when the lookup fails. With COUNT (at most 100000) it looks the
// name up COUNT times and prints only the first result of each: what a client that takes the
// first one (as Go's own net/http dialer does with LookupSRV's order) would pick.
package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"time"
)

func main() {
	if len(os.Args) != 4 && len(os.Args) != 5 {
		fmt.Fprintln(os.Stderr, "usage: resolve SERVER ip4|srv|ptr NAME [COUNT]")
		os.Exit(64)
	}
	server, kind, name := os.Args[1], os.Args[2], os.Args[3]
	count := 0
	if len(os.Args) == 5 {
		n, err := strconv.Atoi(os.Args[4])
		if err != nil || n < 1 || n > 100000 {
			fmt.Fprintln(os.Stderr, "COUNT must be a number from 1 to 100000")
			os.Exit(64)
		}
		count = n
	}
	resolver := &net.Resolver{
		PreferGo: true,
		Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
			fmt.Fprintln(os.Stderr, "dial", network)
			var dialer net.Dialer
			return dialer.DialContext(ctx, network, server)
		},
	}
	if count > 0 {
		for i := 0; i < count; i++ {
			lines, err := lookup(resolver, kind, name)
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(2)
			}
			if len(lines) > 0 {
				fmt.Println(lines[0])
			}
		}
		return
	}
	lines, err := lookup(resolver, kind, name)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	for _, line := range lines {
		fmt.Println(line)
	}
}

// lookup asks one question of the kind given, within 10 seconds.
func lookup(resolver *net.Resolver, kind, name string) ([]string, error) {
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
	return lines, err
}
