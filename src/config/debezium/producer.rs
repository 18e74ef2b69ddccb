//! Kafka Java-client producer settings from a Debezium file, as librdkafka properties.
//!
//! Input: the settings of `producer.override.*` (Connect), `debezium.sink.kafka.producer.*`
//! (Debezium Server), `producer.*`, and top-level `security.protocol`/`sasl.*`/`ssl.*`, prefixes
//! stripped and merged (the most specific wins). Output: librdkafka properties and notes.
//!
//! What changes name or shape:
//! * `sasl.mechanism` → `sasl.mechanisms`; `security.protocol` lower-cased;
//! * `sasl.jaas.config`: `PlainLoginModule`/`ScramLoginModule` → `sasl.username`/`sasl.password`;
//!   `OAuthBearerLoginModule` → librdkafka's built-in OIDC client-credentials flow
//!   (`sasl.oauthbearer.method=oidc`, client id/secret/scope from the JAAS options, the token
//!   endpoint from `sasl.oauthbearer.token.endpoint.url`), or its unsecured JWT for
//!   `unsecuredLoginStringClaim_sub`; `Krb5LoginModule` → `sasl.kerberos.keytab`/`principal`;
//! * `ssl.endpoint.identification.algorithm`: empty → `none`;
//! * PEM trust and key stores → `ssl.ca.location`/`ssl.ca.pem`, `ssl.certificate.location` +
//!   `ssl.key.location`, `ssl.certificate.pem`/`ssl.key.pem`; a PKCS12 keystore passes through
//!   (librdkafka reads it); JKS stores and PKCS12 truststores are errors that print the
//!   conversion command;
//! * `max.request.size` → `message.max.bytes`;
//! * Java-only settings (serializers, `buffer.memory`, callback handler classes, …) are noted and
//!   dropped; every other key passes through under its own name (`acks`, `compression.type`,
//!   `linger.ms`, …), and librdkafka refuses the ones it does not know.
//!
//! Messages name keys, never values.

use std::collections::BTreeMap;

/// librdkafka properties and what to tell the operator.
#[derive(Debug, Default)]
pub struct Mapped {
    pub brokers: Option<String>,
    pub properties: Vec<(String, String)>,
    pub notes: Vec<String>,
}

/// Java settings with no librdkafka meaning: dropped with a note.
const JAVA_ONLY: &[&str] = &[
    "key.serializer",
    "value.serializer",
    "buffer.memory",
    "client.dns.lookup",
    "interceptor.classes",
    "metric.reporters",
    "max.block.ms",
    "partitioner.class",
    "security.providers",
    "sasl.login.callback.handler.class",
    "sasl.client.callback.handler.class",
    "sasl.login.class",
    "ssl.protocol",
    "ssl.enabled.protocols",
    "ssl.trustmanager.algorithm",
    "ssl.keymanager.algorithm",
    "ssl.secure.random.implementation",
    "ssl.provider",
    "ssl.engine.factory.class",
    "ssl.truststore.password",
];

const PLAIN: &str = "org.apache.kafka.common.security.plain.PlainLoginModule";
const SCRAM: &str = "org.apache.kafka.common.security.scram.ScramLoginModule";
const OAUTH: &str = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule";
const KRB5: &str = "com.sun.security.auth.module.Krb5LoginModule";

/// Map merged Java producer settings (prefix stripped) to librdkafka.
pub fn map(settings: &BTreeMap<String, String>) -> Result<Mapped, String> {
    let mut m = Mapped::default();
    let mut rest: BTreeMap<&str, &str> = settings.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    stores(&mut rest, &mut m)?;
    if let Some(jaas) = rest.remove("sasl.jaas.config") {
        let endpoint = rest.remove("sasl.oauthbearer.token.endpoint.url");
        login_module(jaas, endpoint, &mut m)?;
    }
    for (k, v) in rest {
        let set = |m: &mut Mapped, k: &str, v: &str| m.properties.push((k.to_owned(), v.to_owned()));
        match k {
            "bootstrap.servers" => m.brokers = Some(v.to_owned()),
            "security.protocol" => set(&mut m, k, &v.to_ascii_lowercase()),
            "sasl.mechanism" | "sasl.mechanisms" => {
                if v.eq_ignore_ascii_case("AWS_MSK_IAM") {
                    return Err(
                        "producer sasl.mechanism=AWS_MSK_IAM: librdkafka has no MSK IAM login; enable SASL/SCRAM or mTLS on the MSK cluster and use those"
                            .into(),
                    );
                }
                set(&mut m, "sasl.mechanisms", v)
            }
            "ssl.endpoint.identification.algorithm" => match v.trim().to_ascii_lowercase().as_str() {
                "" | "none" => set(&mut m, k, "none"),
                "https" => set(&mut m, k, "https"),
                _ => {
                    return Err(format!(
                        "producer ssl.endpoint.identification.algorithm={v:?}: use https (verify the broker's host name) or empty (do not)"
                    ))
                }
            },
            "max.request.size" => set(&mut m, "message.max.bytes", v),
            k if JAVA_ONLY.contains(&k) || k.starts_with("metrics.") => {
                m.notes.push(format!("producer setting {k} has no librdkafka equivalent; ignored"))
            }
            _ => set(&mut m, k, v),
        }
    }
    Ok(m)
}

/// Trust and key stores: PEM maps, PKCS12 keystores pass, the rest is an error with its fix.
fn stores(rest: &mut BTreeMap<&str, &str>, m: &mut Mapped) -> Result<(), String> {
    let pemish = |p: &str| [".pem", ".crt", ".cer"].iter().any(|e| p.to_ascii_lowercase().ends_with(e));
    let push = |m: &mut Mapped, k: &str, v: &str| m.properties.push((k.to_owned(), v.to_owned()));

    let t_type = rest.remove("ssl.truststore.type").map(str::to_ascii_uppercase);
    let t_loc = rest.remove("ssl.truststore.location");
    let t_pem = rest.remove("ssl.truststore.certificates");
    if t_loc.is_some() || t_pem.is_some() {
        let ty = t_type.unwrap_or_else(|| {
            if t_pem.is_some() || t_loc.is_some_and(pemish) {
                "PEM".into()
            } else {
                "JKS".into()
            }
        });
        match (ty.as_str(), t_loc) {
            ("PEM", _) => {
                if let Some(l) = t_loc {
                    push(m, "ssl.ca.location", l);
                }
                if let Some(p) = t_pem {
                    push(m, "ssl.ca.pem", p);
                }
            }
            ("PKCS12", Some(l)) => {
                return Err(format!(
                    "producer ssl.truststore.type=PKCS12: librdkafka needs PEM CA certificates; run `openssl pkcs12 -in {l} -nokeys -out ca.pem` and set ssl.truststore.type=PEM, ssl.truststore.location=ca.pem"
                ))
            }
            (_, Some(l)) => {
                return Err(format!(
                    "producer ssl.truststore.type={ty}: librdkafka needs PEM CA certificates; run `keytool -importkeystore -srckeystore {l} -srcstoretype {ty} -destkeystore truststore.p12 -deststoretype PKCS12 && openssl pkcs12 -in truststore.p12 -nokeys -out ca.pem` and set ssl.truststore.type=PEM, ssl.truststore.location=ca.pem"
                ))
            }
            (_, None) => return Err(format!("producer ssl.truststore.type={ty} needs ssl.truststore.location")),
        }
    }

    let k_type = rest.remove("ssl.keystore.type").map(str::to_ascii_uppercase);
    let k_loc = rest.remove("ssl.keystore.location");
    let k_chain = rest.remove("ssl.keystore.certificate.chain");
    let k_key = rest.remove("ssl.keystore.key");
    let k_pass = rest.remove("ssl.keystore.password");
    if k_loc.is_none() && k_chain.is_none() && k_key.is_none() {
        if let Some(p) = k_pass {
            push(m, "ssl.keystore.password", p);
        }
        return Ok(());
    }
    let ty = k_type.unwrap_or_else(|| {
        if k_chain.is_some() || k_key.is_some() || k_loc.is_some_and(pemish) {
            "PEM".into()
        } else {
            "JKS".into()
        }
    });
    match (ty.as_str(), k_loc) {
        ("PEM", _) => {
            // A PEM keystore file holds the key and the chain; OpenSSL picks each out of it.
            if let Some(l) = k_loc {
                push(m, "ssl.certificate.location", l);
                push(m, "ssl.key.location", l);
            }
            if let Some(c) = k_chain {
                push(m, "ssl.certificate.pem", c);
            }
            if let Some(k) = k_key {
                push(m, "ssl.key.pem", k);
            }
            if k_pass.is_some() {
                m.notes.push("producer ssl.keystore.password does not apply to a PEM keystore; ignored (ssl.key.password decrypts the key)".into());
            }
        }
        ("PKCS12", Some(l)) => {
            push(m, "ssl.keystore.location", l);
            if let Some(p) = k_pass {
                push(m, "ssl.keystore.password", p);
            }
        }
        (_, Some(l)) => {
            return Err(format!(
                "producer ssl.keystore.type={ty}: librdkafka reads PKCS12 or PEM keystores; run `keytool -importkeystore -srckeystore {l} -srcstoretype {ty} -destkeystore keystore.p12 -deststoretype PKCS12` and set ssl.keystore.type=PKCS12, ssl.keystore.location=keystore.p12"
            ))
        }
        (_, None) => return Err(format!("producer ssl.keystore.type={ty} needs ssl.keystore.location")),
    }
    Ok(())
}

/// The next blank-free word (up to `=` or `;`), leading blanks skipped.
fn word(chars: &mut std::iter::Peekable<std::str::Chars<'_>>) -> String {
    while chars.peek().is_some_and(|c| c.is_whitespace()) {
        chars.next();
    }
    let mut w = String::new();
    while let Some(&c) = chars.peek() {
        if c.is_whitespace() || c == '=' || c == ';' {
            break;
        }
        w.push(c);
        chars.next();
    }
    w
}

/// A parsed JAAS entry: `Module flag key="value" key=value;`.
struct Jaas {
    module: String,
    options: BTreeMap<String, String>,
}

fn parse_jaas(text: &str) -> Result<Jaas, String> {
    let bad =
        |why: &str| format!("producer sasl.jaas.config: {why} (expected `LoginModule required key=\"value\" …;`)");
    let mut chars = text.trim().chars().peekable();
    let module = word(&mut chars);
    let flag = word(&mut chars);
    if module.is_empty() || !["required", "requisite", "sufficient", "optional"].contains(&flag.as_str()) {
        return Err(bad("no login module and control flag"));
    }
    let mut options = BTreeMap::new();
    loop {
        let key = word(&mut chars);
        if key.is_empty() {
            match chars.next() {
                Some(';') | None => break,
                Some(_) => return Err(bad("an option without a name")),
            }
        }
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        if chars.next() != Some('=') {
            return Err(bad(&format!("option {key} has no `=`")));
        }
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        let mut value = String::new();
        if chars.peek() == Some(&'"') {
            chars.next();
            loop {
                match chars.next() {
                    Some('\\') => value.extend(chars.next()),
                    Some('"') => break,
                    Some(c) => value.push(c),
                    None => return Err(bad(&format!("the quoted value of {key} is not closed"))),
                }
            }
        } else {
            value = word(&mut chars);
        }
        options.insert(key, value);
    }
    Ok(Jaas { module, options })
}

fn login_module(jaas: &str, endpoint: Option<&str>, m: &mut Mapped) -> Result<(), String> {
    let j = parse_jaas(jaas)?;
    let opt = |k: &str| j.options.get(k).cloned();
    let push = |m: &mut Mapped, k: &str, v: String| m.properties.push((k.to_owned(), v));
    match j.module.as_str() {
        PLAIN | SCRAM => {
            let (Some(u), Some(p)) = (opt("username"), opt("password")) else {
                return Err(format!("producer sasl.jaas.config: {} needs username=\"…\" and password=\"…\"", j.module));
            };
            push(m, "sasl.username", u);
            push(m, "sasl.password", p);
        }
        OAUTH => {
            if let Some(sub) = opt("unsecuredLoginStringClaim_sub") {
                push(m, "enable.sasl.oauthbearer.unsecure.jwt", "true".into());
                push(m, "sasl.oauthbearer.config", format!("principal={sub}"));
            } else {
                let (Some(id), Some(secret), Some(url)) = (opt("clientId"), opt("clientSecret"), endpoint) else {
                    return Err(
                        "producer sasl.jaas.config: OAuthBearerLoginModule maps to librdkafka's OIDC client-credentials login, which needs clientId=\"…\" and clientSecret=\"…\" in the JAAS entry and sasl.oauthbearer.token.endpoint.url; a custom login callback handler cannot run here"
                            .into(),
                    );
                };
                push(m, "sasl.oauthbearer.method", "oidc".into());
                push(m, "sasl.oauthbearer.client.id", id);
                push(m, "sasl.oauthbearer.client.secret", secret);
                push(m, "sasl.oauthbearer.token.endpoint.url", url.to_owned());
                if let Some(scope) = opt("scope") {
                    push(m, "sasl.oauthbearer.scope", scope);
                }
            }
            let ext: Vec<String> = j
                .options
                .iter()
                .filter_map(|(k, v)| k.strip_prefix("extension_").map(|e| format!("{e}={v}")))
                .collect();
            if !ext.is_empty() {
                push(m, "sasl.oauthbearer.extensions", ext.join(","));
            }
        }
        KRB5 => {
            if let Some(k) = opt("keyTab") {
                push(m, "sasl.kerberos.keytab", k);
            }
            if let Some(p) = opt("principal") {
                push(m, "sasl.kerberos.principal", p);
            }
        }
        other => {
            return Err(format!(
                "producer sasl.jaas.config: login module {other} has no librdkafka equivalent; use PlainLoginModule, ScramLoginModule, OAuthBearerLoginModule (OIDC) or Krb5LoginModule"
            ))
        }
    }
    if endpoint.is_some() && j.module != OAUTH {
        m.notes.push(
            "producer sasl.oauthbearer.token.endpoint.url applies only to OAuthBearerLoginModule; ignored".into(),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    fn props(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        map(&settings(pairs)).unwrap().properties.into_iter().collect()
    }

    #[test]
    fn sasl_plain_and_scram_become_username_and_password() {
        for module in [PLAIN, SCRAM] {
            let p = props(&[
                ("security.protocol", "SASL_SSL"),
                ("sasl.mechanism", "SCRAM-SHA-512"),
                ("sasl.jaas.config", &format!("{module} required username=\"alice\" password=\"p\\\"w;d\";")),
            ]);
            assert_eq!(p["security.protocol"], "sasl_ssl");
            assert_eq!(p["sasl.mechanisms"], "SCRAM-SHA-512");
            assert_eq!(p["sasl.username"], "alice");
            assert_eq!(p["sasl.password"], "p\"w;d");
            assert!(!p.contains_key("sasl.jaas.config") && !p.contains_key("sasl.mechanism"));
        }
        let p = props(&[("sasl.jaas.config", &format!("{PLAIN} required username=bob password=unquoted;"))]);
        assert_eq!((p["sasl.username"].as_str(), p["sasl.password"].as_str()), ("bob", "unquoted"));
    }

    #[test]
    fn oauthbearer_maps_to_oidc_or_fails_clearly() {
        let p = props(&[
            ("sasl.mechanism", "OAUTHBEARER"),
            ("sasl.oauthbearer.token.endpoint.url", "https://idp/token"),
            (
                "sasl.jaas.config",
                &format!("{OAUTH} required clientId=\"cid\" clientSecret=\"csecret\" scope=\"kafka\" extension_logicalCluster=\"lkc-1\";"),
            ),
        ]);
        assert_eq!(p["sasl.oauthbearer.method"], "oidc");
        assert_eq!(p["sasl.oauthbearer.client.id"], "cid");
        assert_eq!(p["sasl.oauthbearer.client.secret"], "csecret");
        assert_eq!(p["sasl.oauthbearer.token.endpoint.url"], "https://idp/token");
        assert_eq!(p["sasl.oauthbearer.scope"], "kafka");
        assert_eq!(p["sasl.oauthbearer.extensions"], "logicalCluster=lkc-1");
        let p = props(&[("sasl.jaas.config", &format!("{OAUTH} required unsecuredLoginStringClaim_sub=\"me\";"))]);
        assert_eq!(p["enable.sasl.oauthbearer.unsecure.jwt"], "true");
        assert_eq!(p["sasl.oauthbearer.config"], "principal=me");
        let e = map(&settings(&[("sasl.jaas.config", &format!("{OAUTH} required clientSecret=\"csecret\";"))]))
            .unwrap_err();
        assert!(e.contains("clientId") && e.contains("token.endpoint.url") && !e.contains("csecret"), "{e}");
    }

    #[test]
    fn bad_jaas_never_shows_the_password() {
        for bad in [
            format!("{PLAIN} required username=\"a\" password=\"hunter22"),
            format!("{PLAIN} username=\"a\" password=\"hunter22\";"),
            "com.example.Custom required password=\"hunter22\";".to_owned(),
            format!("{PLAIN} required password=\"hunter22\";"),
        ] {
            let e = map(&settings(&[("sasl.jaas.config", &bad)])).unwrap_err();
            assert!(!e.contains("hunter22") && e.contains("sasl.jaas.config"), "{e}");
        }
        let e = map(&settings(&[("sasl.mechanism", "AWS_MSK_IAM")])).unwrap_err();
        assert!(e.contains("SCRAM"), "{e}");
    }

    #[test]
    fn endpoint_identification_and_pass_through() {
        let p = props(&[
            ("ssl.endpoint.identification.algorithm", ""),
            ("compression.type", "zstd"),
            ("acks", "all"),
            ("max.request.size", "2097152"),
            ("key.serializer", "org.apache.kafka.common.serialization.StringSerializer"),
        ]);
        assert_eq!(p["ssl.endpoint.identification.algorithm"], "none");
        assert_eq!((p["compression.type"].as_str(), p["acks"].as_str()), ("zstd", "all"));
        assert_eq!(p["message.max.bytes"], "2097152");
        assert!(!p.contains_key("key.serializer"));
        assert_eq!(
            props(&[("ssl.endpoint.identification.algorithm", "HTTPS")])["ssl.endpoint.identification.algorithm"],
            "https"
        );
        assert!(map(&settings(&[("ssl.endpoint.identification.algorithm", "ldap")])).is_err());
    }

    #[test]
    fn pem_stores_map_and_jks_or_pkcs12_print_the_conversion() {
        let p = props(&[
            ("ssl.truststore.type", "PEM"),
            ("ssl.truststore.location", "/certs/ca.pem"),
            ("ssl.keystore.type", "PEM"),
            ("ssl.keystore.location", "/certs/client.pem"),
            ("ssl.key.password", "kp"),
        ]);
        assert_eq!(p["ssl.ca.location"], "/certs/ca.pem");
        assert_eq!(p["ssl.certificate.location"], "/certs/client.pem");
        assert_eq!(p["ssl.key.location"], "/certs/client.pem");
        assert_eq!(p["ssl.key.password"], "kp");
        let p = props(&[
            ("ssl.truststore.type", "PEM"),
            ("ssl.truststore.certificates", "-----BEGIN CERTIFICATE-----\nCA"),
            ("ssl.keystore.type", "PEM"),
            ("ssl.keystore.certificate.chain", "-----BEGIN CERTIFICATE-----\nC"),
            ("ssl.keystore.key", "-----BEGIN PRIVATE KEY-----\nK"),
        ]);
        assert!(p["ssl.ca.pem"].ends_with("CA") && p["ssl.certificate.pem"].ends_with("C"));
        assert!(p["ssl.key.pem"].ends_with("K"));
        let p = props(&[("ssl.truststore.location", "/c/ca.crt")]);
        assert_eq!(p["ssl.ca.location"], "/c/ca.crt", "a .crt truststore without a type is PEM");
        let p = props(&[
            ("ssl.keystore.type", "PKCS12"),
            ("ssl.keystore.location", "/c/k.p12"),
            ("ssl.keystore.password", "ksp"),
        ]);
        assert_eq!((p["ssl.keystore.location"].as_str(), p["ssl.keystore.password"].as_str()), ("/c/k.p12", "ksp"));

        let e = map(&settings(&[("ssl.truststore.location", "/c/trust.jks"), ("ssl.truststore.password", "tsp")]))
            .unwrap_err();
        assert!(
            e.contains("keytool -importkeystore -srckeystore /c/trust.jks -srcstoretype JKS")
                && e.contains("-deststoretype PKCS12"),
            "{e}"
        );
        assert!(e.contains("openssl pkcs12 -in truststore.p12 -nokeys -out ca.pem") && !e.contains("tsp"), "{e}");
        let e =
            map(&settings(&[("ssl.truststore.type", "PKCS12"), ("ssl.truststore.location", "/c/t.p12")])).unwrap_err();
        assert!(e.contains("openssl pkcs12 -in /c/t.p12 -nokeys -out ca.pem"), "{e}");
        let e = map(&settings(&[("ssl.keystore.type", "JKS"), ("ssl.keystore.location", "/c/k.jks")])).unwrap_err();
        assert!(e.contains("-srckeystore /c/k.jks") && e.contains("ssl.keystore.type=PKCS12"), "{e}");
    }
}
