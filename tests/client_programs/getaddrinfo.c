/* getaddrinfo(NAME) for IPv4, as an application resolves: one address a line; exit 2 with
 * gai_strerror's words when there is none. Linked with musl (musl-gcc) it is musl's resolver,
 * which reads /etc/resolv.conf (search, ndots) and, up to 1.2.3, never retries over TCP; with
 * gcc, glibc's.
 *
 *	getaddrinfo NAME [COUNT]
 *
 * With COUNT (at most 100000) it resolves NAME COUNT times and prints each result on one
 * line, its addresses separated by spaces: the replies a client gets in turn. */
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

static int resolve(const char *name, const char *between)
{
	struct addrinfo hints, *found, *each;
	char text[INET_ADDRSTRLEN];
	int rc;

	memset(&hints, 0, sizeof hints);
	hints.ai_family = AF_INET; /* A queries only: AAAA is not what these tests ask about */
	hints.ai_socktype = SOCK_STREAM;
	rc = getaddrinfo(name, NULL, &hints, &found);
	if (rc != 0) {
		fprintf(stderr, "%s\n", gai_strerror(rc));
		return 2;
	}
	for (each = found; each; each = each->ai_next) {
		struct sockaddr_in *in = (struct sockaddr_in *)each->ai_addr;
		printf("%s%s", inet_ntop(AF_INET, &in->sin_addr, text, sizeof text),
		       each->ai_next ? between : "\n");
	}
	freeaddrinfo(found);
	return 0;
}

int main(int argc, char **argv)
{
	long count, i;
	char *end;

	if (argc == 2)
		return resolve(argv[1], "\n");
	if (argc != 3) {
		fprintf(stderr, "usage: %s NAME [COUNT]\n", argv[0]);
		return 64;
	}
	count = strtol(argv[2], &end, 10);
	if (*end || count < 1 || count > 100000) {
		fprintf(stderr, "COUNT must be a number from 1 to 100000\n");
		return 64;
	}
	for (i = 0; i < count; i++)
		if (resolve(argv[1], " ") != 0)
			return 2;
	return 0;
}
