/* getaddrinfo(NAME) for IPv4, as an application resolves: one address a line; exit 2 with
 * gai_strerror's words when there is none. Linked with musl (musl-gcc) it is musl's resolver,
 * which reads /etc/resolv.conf (search, ndots) and, up to 1.2.3, never retries over TCP. */
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

int main(int argc, char **argv)
{
	struct addrinfo hints, *found, *each;
	char text[INET_ADDRSTRLEN];
	int rc;

	if (argc != 2) {
		fprintf(stderr, "usage: %s NAME\n", argv[0]);
		return 64;
	}
	memset(&hints, 0, sizeof hints);
	hints.ai_family = AF_INET; /* A queries only: AAAA is not what these tests ask about */
	hints.ai_socktype = SOCK_STREAM;
	rc = getaddrinfo(argv[1], NULL, &hints, &found);
	if (rc != 0) {
		fprintf(stderr, "%s\n", gai_strerror(rc));
		return 2;
	}
	for (each = found; each; each = each->ai_next) {
		struct sockaddr_in *in = (struct sockaddr_in *)each->ai_addr;
		printf("%s\n", inet_ntop(AF_INET, &in->sin_addr, text, sizeof text));
	}
	freeaddrinfo(found);
	return 0;
}
