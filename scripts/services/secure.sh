# Sourced by scripts/services.sh: the secured services (`up --secure`), a
# second Kafka broker and a second Postgres cluster that accept nothing in
# plaintext, for the tests of docstream's TLS, SASL and client certificates
# (tests/it/secure.rs). They run beside the plaintext pair and share nothing
# with it but the Kafka jars and the Postgres binaries.
#
# .services/tls/        a test CA and what it signed, made with openssl:
#   ca.pem                the CA every client trusts
#   server.pem/.key       the servers' certificate, for DNS:localhost only (a
#                         client that connects to 127.0.0.1 sees a name mismatch)
#   server.p12            the same as the broker's PKCS#12 keystore
#   client.pem/.key       a client certificate, CN=docstream (mTLS)
#   rogue-ca.pem          a CA that signed none of them (the untrusted-CA test)
#   oidc.key              the RSA key the test token endpoint signs with
# .services/kafka-secure/ the broker: SASL_SSL with SCRAM-SHA-512 on 59096
#                         (users docstream and admin, made when the storage is
#                         formatted), SSL with a required client certificate on
#                         59098, SASL_SSL with OAUTHBEARER on 59099 (tokens checked
#                         against the JWKS of the token endpoint), its KRaft
#                         controller on 59097 (loopback)
# .services/oidc/       an OIDC client-credentials token endpoint on 59088
#                         (scripts/services/oidc.py, PyJWT): client docstream
# postgres secure/      a cluster on 55434 with ssl=on: the pg_hba.conf admits
#                         docstream over hostssl only (password), docstream_cert
#                         over hostssl with a certificate, and rejects hostnossl

SECURE_KAFKA_PORT="${DOCSTREAM_SECURE_KAFKA_PORT:-59096}"
SECURE_KAFKA_CTRL_PORT="${DOCSTREAM_SECURE_KAFKA_CONTROLLER_PORT:-59097}"
SECURE_KAFKA_MTLS_PORT="${DOCSTREAM_SECURE_KAFKA_MTLS_PORT:-59098}"
SECURE_KAFKA_OAUTH_PORT="${DOCSTREAM_SECURE_KAFKA_OAUTH_PORT:-59099}"
OIDC_PORT="${DOCSTREAM_OIDC_PORT:-59088}"
OIDC_URL="http://$HOST:$OIDC_PORT"
OIDC_DIR="$STATE/oidc"
OIDC_CLIENT=docstream OIDC_SECRET=docstream-oidc-secret
SECURE_PG_PORT="${DOCSTREAM_SECURE_PG_PORT:-55434}"
SECURE_NAME=localhost
TLS_DIR="$STATE/tls"
# The keystore's password: a test secret, like every password here.
TLS_STORE_PASSWORD=docstream-store
SCRAM_USER=docstream SCRAM_PASSWORD=docstream-scram-secret
SCRAM_ADMIN=admin SCRAM_ADMIN_PASSWORD=admin-scram-secret
SECURE_KAFKA_DIR="$STATE/kafka-secure"
SECURE_KAFKA_CONF="$SECURE_KAFKA_DIR/server.properties"
SECURE_KAFKA_PID="$SECURE_KAFKA_DIR/kafka.pid"
SECURE_KAFKA_LOG="$SECURE_KAFKA_DIR/kafka.log"
# The plaintext broker's heap: the benchmark compares the two.
SECURE_KAFKA_HEAP="${DOCSTREAM_SECURE_KAFKA_HEAP_OPTS:-$KAFKA_HEAP_OPTS}"

secure_ports() { echo "$SECURE_KAFKA_PORT,$SECURE_KAFKA_CTRL_PORT,$SECURE_KAFKA_MTLS_PORT,$SECURE_KAFKA_OAUTH_PORT,$OIDC_PORT,$SECURE_PG_PORT"; }

# One certificate signed by the CA: name $1, subject $2, extensions $3.
tls_sign() {
    local name="$1" subject="$2" ext="$3"
    openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$TLS_DIR/$name.key" 2>/dev/null
    openssl req -new -key "$TLS_DIR/$name.key" -subj "$subject" -out "$TLS_DIR/$name.csr" 2>/dev/null
    printf '%s\n' "$ext" > "$TLS_DIR/$name.ext"
    openssl x509 -req -in "$TLS_DIR/$name.csr" -CA "$TLS_DIR/ca.pem" -CAkey "$TLS_DIR/ca.key" \
        -CAcreateserial -days 3650 -sha256 -extfile "$TLS_DIR/$name.ext" -out "$TLS_DIR/$name.pem" 2>/dev/null
    rm -f "$TLS_DIR/$name.csr" "$TLS_DIR/$name.ext"
}

# The CA and its certificates, made once; the token endpoint's key too.
tls_make() {
    if [ -f "$TLS_DIR/done" ]; then
        [ -f "$TLS_DIR/oidc.key" ] || openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 \
            -out "$TLS_DIR/oidc.key" 2>/dev/null
        return 0
    fi
    command -v openssl >/dev/null || apt_install openssl
    log "making a test CA and certificates in $TLS_DIR"
    rm -rf "$TLS_DIR"; mkdir -p "$TLS_DIR"
    local ca
    for ca in ca rogue-ca; do
        openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 3650 \
            -subj "/CN=docstream test $ca" -keyout "$TLS_DIR/$ca.key" -out "$TLS_DIR/$ca.pem" \
            -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign 2>/dev/null
    done
    tls_sign server "/CN=$SECURE_NAME" \
        "subjectAltName=DNS:$SECURE_NAME
extendedKeyUsage=serverAuth,clientAuth"
    tls_sign client "/CN=docstream" "extendedKeyUsage=clientAuth"
    openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$TLS_DIR/oidc.key" 2>/dev/null
    tls_sign client-cert-user "/CN=docstream_cert" "extendedKeyUsage=clientAuth"
    openssl pkcs12 -export -in "$TLS_DIR/server.pem" -inkey "$TLS_DIR/server.key" \
        -certfile "$TLS_DIR/ca.pem" -name broker -passout "pass:$TLS_STORE_PASSWORD" \
        -out "$TLS_DIR/server.p12"
    # Readable by the tests' processes and by the postgres user's copy.
    chmod 644 "$TLS_DIR"/*
    chmod 600 "$TLS_DIR"/*.key
    touch "$TLS_DIR/done"
}

secure_kafka_render_conf() {
    cat <<EOF
# Written by scripts/services.sh (up --secure) — edits are overwritten on every 'up'.
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@$HOST:$SECURE_KAFKA_CTRL_PORT
listeners=SASL_SSL://$HOST:$SECURE_KAFKA_PORT,CONTROLLER://$HOST:$SECURE_KAFKA_CTRL_PORT,MTLS://$HOST:$SECURE_KAFKA_MTLS_PORT,OAUTH://$HOST:$SECURE_KAFKA_OAUTH_PORT
advertised.listeners=SASL_SSL://$SECURE_NAME:$SECURE_KAFKA_PORT,MTLS://$SECURE_NAME:$SECURE_KAFKA_MTLS_PORT,OAUTH://$SECURE_NAME:$SECURE_KAFKA_OAUTH_PORT
controller.listener.names=CONTROLLER
inter.broker.listener.name=SASL_SSL
listener.security.protocol.map=CONTROLLER:PLAINTEXT,SASL_SSL:SASL_SSL,MTLS:SSL,OAUTH:SASL_SSL
sasl.enabled.mechanisms=SCRAM-SHA-512
sasl.mechanism.inter.broker.protocol=SCRAM-SHA-512
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="$SCRAM_ADMIN" password="$SCRAM_ADMIN_PASSWORD";
ssl.keystore.type=PKCS12
ssl.keystore.location=$TLS_DIR/server.p12
ssl.keystore.password=$TLS_STORE_PASSWORD
ssl.key.password=$TLS_STORE_PASSWORD
ssl.truststore.type=PEM
ssl.truststore.location=$TLS_DIR/ca.pem
listener.name.mtls.ssl.client.auth=required
# ACLs: nothing is allowed that no ACL allows (secure_kafka_acls grants
# docstream's principals what docs/src/secure.md lists). The controller
# listener is plaintext on loopback, so its principal, ANONYMOUS, is a super user.
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
allow.everyone.if.no.acl.found=false
super.users=User:$SCRAM_ADMIN;User:ANONYMOUS
# OAUTHBEARER: a token from the test endpoint, its signature checked against
# the endpoint's JWKS, its audience and issuer too.
listener.name.oauth.sasl.enabled.mechanisms=OAUTHBEARER
listener.name.oauth.oauthbearer.sasl.jaas.config=org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required ;
listener.name.oauth.oauthbearer.sasl.server.callback.handler.class=org.apache.kafka.common.security.oauthbearer.OAuthBearerValidatorCallbackHandler
sasl.oauthbearer.jwks.endpoint.url=$OIDC_URL/jwks
sasl.oauthbearer.expected.audience=kafka
sasl.oauthbearer.expected.issuer=$OIDC_URL
log.dirs=$SECURE_KAFKA_DIR/data

$(kafka_single_node_conf)
EOF
}

secure_kafka_up() {
    kafka_fetch_libs
    kafka_write_shared_files
    mkdir -p "$SECURE_KAFKA_DIR"
    local new changed=0
    new="$(secure_kafka_render_conf)"
    if [ ! -f "$SECURE_KAFKA_CONF" ] || [ "$new" != "$(cat "$SECURE_KAFKA_CONF")" ]; then
        printf '%s\n' "$new" > "$SECURE_KAFKA_CONF"
        changed=1
    fi
    if [ ! -f "$SECURE_KAFKA_DIR/data/meta.properties" ]; then
        local cid
        cid="$(kafka_tool kafka.tools.StorageTool random-uuid)"
        log "formatting the secured Kafka's storage, with its SCRAM users"
        kafka_tool kafka.tools.StorageTool format -t "$cid" -c "$SECURE_KAFKA_CONF" \
            --add-scram "SCRAM-SHA-512=[name=$SCRAM_USER,password=$SCRAM_PASSWORD]" \
            --add-scram "SCRAM-SHA-512=[name=$SCRAM_ADMIN,password=$SCRAM_ADMIN_PASSWORD]" >/dev/null
    fi
    local pid
    if pid="$(broker_pid "$SECURE_KAFKA_CONF" "$SECURE_KAFKA_PID")"; then
        if [ "$changed" = 1 ]; then
            broker_stop "$pid" "the secured kafka"
        elif port_open "$SECURE_KAFKA_PORT"; then
            return 0
        fi
    fi
    if ! broker_pid "$SECURE_KAFKA_CONF" "$SECURE_KAFKA_PID" >/dev/null; then
        local p
        for p in "$SECURE_KAFKA_PORT" "$SECURE_KAFKA_CTRL_PORT" "$SECURE_KAFKA_MTLS_PORT" "$SECURE_KAFKA_OAUTH_PORT"; do
            port_open "$p" && die "port $HOST:$p is taken by another process (set DOCSTREAM_SECURE_KAFKA_PORT and its neighbours)"
        done
        log "starting the secured kafka on $HOST:$SECURE_KAFKA_PORT (SASL_SSL) and $SECURE_KAFKA_MTLS_PORT (SSL, client certificates) (log: $SECURE_KAFKA_LOG)"
        # Kafka fetches only the URLs it is told it may (KIP-1125 era default: none).
        broker_launch "$SECURE_KAFKA_CONF" "$SECURE_KAFKA_LOG" "$SECURE_KAFKA_PID" \
            "$SECURE_KAFKA_HEAP -Dorg.apache.kafka.sasl.oauthbearer.allowed.urls=$OIDC_URL/jwks"
    fi
    broker_wait_started "$SECURE_KAFKA_PID" "$SECURE_KAFKA_LOG" "$SECURE_KAFKA_PORT"
    secure_kafka_acls
}

# What docs/src/secure.md says docstream needs, for its SCRAM and OAUTHBEARER
# user and its client certificate's principal, on every topic and group
# named with the prefix `secure` (the secured tests' topic prefixes start
# with it). Delete on topics is the tests' clean-up, not docstream's need.
# Granted once per formatted storage (the ACLs live in its metadata).
secure_kafka_acls() {
    local done="$SECURE_KAFKA_DIR/data/.docstream-acls"
    [ -f "$done" ] && return 0
    cat > "$SECURE_KAFKA_DIR/admin.properties" <<EOF
security.protocol=SASL_SSL
sasl.mechanism=SCRAM-SHA-512
sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="$SCRAM_ADMIN" password="$SCRAM_ADMIN_PASSWORD";
ssl.truststore.type=PEM
ssl.truststore.location=$TLS_DIR/ca.pem
EOF
    log "granting docstream's ACLs on the secured kafka"
    local principal
    for principal in "User:$SCRAM_USER" "User:CN=docstream"; do
        kafka_tool org.apache.kafka.tools.AclCommand --bootstrap-server "$SECURE_NAME:$SECURE_KAFKA_PORT" \
            --command-config "$SECURE_KAFKA_DIR/admin.properties" --add --allow-principal "$principal" \
            --resource-pattern-type prefixed --topic secure \
            --operation Describe --operation DescribeConfigs --operation Create \
            --operation Read --operation Write --operation Delete >/dev/null
        kafka_tool org.apache.kafka.tools.AclCommand --bootstrap-server "$SECURE_NAME:$SECURE_KAFKA_PORT" \
            --command-config "$SECURE_KAFKA_DIR/admin.properties" --add --allow-principal "$principal" \
            --resource-pattern-type prefixed --group secure \
            --operation Describe --operation Read >/dev/null
    done
    touch "$done"
}

secure_kafka_down() {
    local pid
    pid="$(broker_pid "$SECURE_KAFKA_CONF" "$SECURE_KAFKA_PID")" || return 0
    broker_stop "$pid" "the secured kafka"
}

secure_pg_paths() {
    pg_prepare_dir
    SECURE_PG_DATA="$PG_HOME/secure"
    SECURE_PG_SOCK="$PG_HOME/secure-run"
    SECURE_PG_LOG="$PG_HOME/secure.log"
}

secure_pg_running() { pg_cluster_running "$SECURE_PG_DATA"; }

secure_pg_sql() {
    as_pg "$PG_BIN/psql" -X -q -v ON_ERROR_STOP=1 -h "$SECURE_PG_SOCK" -p "$SECURE_PG_PORT" -U postgres -d postgres "$@"
}

secure_pg_up() {
    secure_pg_paths
    if [ ! -f "$SECURE_PG_DATA/PG_VERSION" ]; then
        log "initdb $SECURE_PG_DATA"
        as_pg "$PG_BIN/initdb" -D "$SECURE_PG_DATA" -U postgres -E UTF8 --locale=C \
            --auth-local=trust --auth-host=reject >/dev/null
        echo "include_if_exists = 'docstream.conf'" | as_pg tee -a "$SECURE_PG_DATA/postgresql.conf" >/dev/null
    fi
    as_pg mkdir -p "$SECURE_PG_SOCK"
    local f
    for f in server.pem server.key ca.pem; do
        install -o postgres -g postgres -m 600 "$TLS_DIR/$f" "$SECURE_PG_DATA/tls-$f"
    done
    # The plaintext cluster's settings (the benchmark compares the two), on
    # its own port and socket, with TLS on.
    local conf old="" restart=0
    conf="$(pg_render_conf | sed -e "s|^port = .*|port = $SECURE_PG_PORT|" \
            -e "s|^unix_socket_directories = .*|unix_socket_directories = '$SECURE_PG_SOCK'|"
        printf '%s\n' "ssl = on" "ssl_cert_file = 'tls-server.pem'" \
            "ssl_key_file = 'tls-server.key'" "ssl_ca_file = 'tls-ca.pem'")"
    [ -f "$SECURE_PG_DATA/docstream.conf" ] && old="$(cat "$SECURE_PG_DATA/docstream.conf")"
    if [ "$conf" != "$old" ]; then
        printf '%s\n' "$conf" | as_pg tee "$SECURE_PG_DATA/docstream.conf" >/dev/null
        restart=1
    fi
    as_pg tee "$SECURE_PG_DATA/pg_hba.conf" >/dev/null <<EOF
# Written by scripts/services.sh (up --secure).
# TYPE     DATABASE USER            ADDRESS       METHOD
local      all      postgres                      trust
hostnossl  all      all             0.0.0.0/0     reject
hostnossl  all      all             ::/0          reject
hostssl    all      docstream_cert  127.0.0.1/32  cert
hostssl    all      docstream       127.0.0.1/32  scram-sha-256
EOF
    if secure_pg_running && [ "$restart" = 1 ]; then
        log "the secured postgres's config changed; restarting"
        as_pg "$PG_BIN/pg_ctl" -D "$SECURE_PG_DATA" -m fast -w -t 60 stop >/dev/null
    fi
    if secure_pg_running; then
        as_pg "$PG_BIN/pg_ctl" -D "$SECURE_PG_DATA" -w reload >/dev/null
    else
        port_open "$SECURE_PG_PORT" && die "port $HOST:$SECURE_PG_PORT is taken (set DOCSTREAM_SECURE_PG_PORT)"
        log "starting the secured postgres on $HOST:$SECURE_PG_PORT (log: $SECURE_PG_LOG)"
        (cd / && setsid runuser -u postgres -- "$PG_BIN/pg_ctl" -D "$SECURE_PG_DATA" -l "$SECURE_PG_LOG" \
            -w -t "$DEADLINE_SECS" start >/dev/null 2>&1 </dev/null 9>&-) \
            || { tail -n 20 "$SECURE_PG_LOG" >&2; die "the secured postgres did not start"; }
    fi
    secure_pg_sql <<SQL
DO \$\$BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '$PG_USER') THEN
    CREATE ROLE $PG_USER LOGIN SUPERUSER PASSWORD '$PG_PASSWORD';
  END IF;
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'docstream_cert') THEN
    CREATE ROLE docstream_cert LOGIN SUPERUSER;
  END IF;
END\$\$;
SQL
    if [ -z "$(secure_pg_sql -tA -c "SELECT 1 FROM pg_database WHERE datname = '$PG_DB'")" ]; then
        secure_pg_sql -c "CREATE DATABASE $PG_DB OWNER $PG_USER"
    fi
}

secure_pg_down() {
    [ -e "$PG_LINK" ] || return 0
    PG_BIN="$(pg_bindir)" || return 0
    secure_pg_paths
    secure_pg_running || return 0
    log "stopping the secured postgres"
    as_pg "$PG_BIN/pg_ctl" -D "$SECURE_PG_DATA" -m fast -w -t 30 stop >/dev/null 2>&1 \
        || as_pg "$PG_BIN/pg_ctl" -D "$SECURE_PG_DATA" -m immediate -w -t 10 stop >/dev/null 2>&1 || true
}

oidc_pid() { pid_running_as "$OIDC_DIR/oidc.pid" "services/oidc.py"; }

# The token endpoint, before the broker: the broker reads its JWKS.
oidc_up() {
    /usr/bin/python3 -c 'import jwt, cryptography' 2>/dev/null || apt_install python3-jwt python3-cryptography
    mkdir -p "$OIDC_DIR"
    oidc_pid >/dev/null && return 0
    port_open "$OIDC_PORT" && die "port $HOST:$OIDC_PORT is taken (set DOCSTREAM_OIDC_PORT)"
    log "starting the test token endpoint on $OIDC_URL (log: $OIDC_DIR/oidc.log)"
    # shellcheck disable=SC2016
    setsid bash -c 'echo $$ > "$1"; shift; exec "$@"' _ "$OIDC_DIR/oidc.pid" \
        /usr/bin/python3 "$REPO/scripts/services/oidc.py" --port "$OIDC_PORT" \
        --key "$TLS_DIR/oidc.key" --client "$OIDC_CLIENT:$OIDC_SECRET" \
        >>"$OIDC_DIR/oidc.log" 2>&1 </dev/null 9>&- &
    disown || true
    local t0=$SECONDS
    until port_open "$OIDC_PORT"; do
        (( SECONDS - t0 > 30 )) && { tail -n 20 "$OIDC_DIR/oidc.log" >&2 || true; die "the token endpoint did not start"; }
        sleep 0.2
    done
}

oidc_down() {
    local pid
    pid="$(oidc_pid)" || return 0
    log "stopping the test token endpoint"
    kill -TERM "$pid" 2>/dev/null || true
}

secure_up() {
    tls_make
    secure_pg_up
    oidc_up
    secure_kafka_up
}

secure_down() {
    secure_kafka_down
    oidc_down
    secure_pg_down
}

# The export lines of the secured pair, for tests/it/secure.rs.
secure_print_env() {
    echo "export DOCSTREAM_TEST_TLS_DIR=$TLS_DIR"
    echo "export DOCSTREAM_TEST_SECURE_KAFKA=$SECURE_NAME:$SECURE_KAFKA_PORT"
    echo "export DOCSTREAM_TEST_SECURE_KAFKA_MTLS=$SECURE_NAME:$SECURE_KAFKA_MTLS_PORT"
    echo "export DOCSTREAM_TEST_SECURE_KAFKA_USER=$SCRAM_USER"
    echo "export DOCSTREAM_TEST_SECURE_KAFKA_PASSWORD=$SCRAM_PASSWORD"
    echo "export DOCSTREAM_TEST_SECURE_PG=$SECURE_NAME:$SECURE_PG_PORT"
    echo "export DOCSTREAM_TEST_SECURE_KAFKA_OAUTH=$SECURE_NAME:$SECURE_KAFKA_OAUTH_PORT"
    echo "export DOCSTREAM_TEST_OIDC_TOKEN_URL=$OIDC_URL/token"
    echo "export DOCSTREAM_TEST_OIDC_CLIENT=$OIDC_CLIENT"
    echo "export DOCSTREAM_TEST_OIDC_SECRET=$OIDC_SECRET"
}
