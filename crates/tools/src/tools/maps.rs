//! Coordinates from Google and Apple Maps links, offline.
//!
//! Forms understood: `!3dLAT!4dLNG` (the place itself, preferred), `/@LAT,LNG,zoom` (the map's centre),
//! and the query parameters `q`, `ll`, `query`, `coordinate`, `center`, `daddr`, `destination`, `sll`.
//! Short links (`maps.app.goo.gl`, `goo.gl/maps`, `maps.apple/p`) cannot be resolved without a network
//! call and come back without coordinates, flagged as short.

use url::Url;

/// What a maps link says.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct MapsLink {
    /// Latitude and longitude, range-checked.
    pub(crate) coords: Option<(f64, f64)>,
    /// A short link whose target is unknown offline.
    pub(crate) short: bool,
    pub(crate) provider: &'static str,
}

/// Why a link was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum MapsError {
    #[error("is not a URL")]
    NotUrl,
    #[error("is not a Google Maps or Apple Maps link")]
    NotMaps,
    #[error("holds coordinates out of range (latitude -90..90, longitude -180..180)")]
    OutOfRange,
}

pub(crate) fn parse(text: &str) -> Result<MapsLink, MapsError> {
    let url = Url::parse(text.trim()).map_err(|_| MapsError::NotUrl)?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(MapsError::NotUrl);
    }
    let host = url.host_str().unwrap_or("").to_ascii_lowercase();
    let host = host.strip_prefix("www.").unwrap_or(&host);
    let path = url.path();
    let (provider, short) =
        if host == "maps.app.goo.gl" || (host == "goo.gl" && path.starts_with("/maps")) {
            ("google", true)
        } else if host == "maps.apple" || (host == "maps.apple.com" && path.starts_with("/p/")) {
            ("apple", true)
        } else if host == "maps.apple.com" || host == "beta.maps.apple.com" {
            ("apple", false)
        } else if is_google(host) && (host.starts_with("maps.") || path.starts_with("/maps")) {
            ("google", false)
        } else {
            return Err(MapsError::NotMaps);
        };
    let decoded = percent_decode(url.as_str());
    let coords = bang_coords(&decoded)
        .or_else(|| at_coords(&percent_decode(path)))
        .or_else(|| {
            const KEYS: [&str; 8] = [
                "q",
                "ll",
                "query",
                "coordinate",
                "center",
                "daddr",
                "destination",
                "sll",
            ];
            KEYS.iter().find_map(|k| {
                url.query_pairs()
                    .find(|(key, _)| key == k)
                    .and_then(|(_, v)| pair(&v))
            })
        });
    if let Some((lat, lng)) = coords
        && !((-90.0..=90.0).contains(&lat) && (-180.0..=180.0).contains(&lng))
    {
        return Err(MapsError::OutOfRange);
    }
    Ok(MapsLink {
        coords,
        short: short && coords.is_none(),
        provider,
    })
}

fn is_google(host: &str) -> bool {
    let base = host.strip_prefix("maps.").unwrap_or(host);
    base == "google.com" || base.starts_with("google.") || base.starts_with("google.co.")
}

fn percent_decode(s: &str) -> String {
    url::form_urlencoded::parse(format!("x={}", s.replace('+', "%2B")).as_bytes())
        .next()
        .map(|(_, v)| v.into_owned())
        .unwrap_or_else(|| s.to_owned())
}

/// `LAT,LNG` at the start of `s` (spaces allowed around the comma).
fn pair(s: &str) -> Option<(f64, f64)> {
    let s = s.trim().trim_start_matches("loc:");
    let (a, rest) = s.split_once(',')?;
    let b: String = rest
        .trim_start()
        .chars()
        .take_while(|c| c.is_ascii_digit() || matches!(c, '-' | '+' | '.'))
        .collect();
    let lat = number(a.trim())?;
    let lng = number(&b)?;
    Some((lat, lng))
}

fn number(s: &str) -> Option<f64> {
    if s.is_empty()
        || !s
            .chars()
            .all(|c| c.is_ascii_digit() || matches!(c, '-' | '+' | '.'))
    {
        return None;
    }
    s.parse::<f64>().ok().filter(|x| x.is_finite())
}

fn bang_coords(s: &str) -> Option<(f64, f64)> {
    let lat_at = s.rfind("!3d")?;
    let rest = &s[lat_at + 3..];
    let (lat, rest) = rest.split_once("!4d")?;
    let lng: String = rest
        .chars()
        .take_while(|c| c.is_ascii_digit() || matches!(c, '-' | '+' | '.'))
        .collect();
    Some((number(lat)?, number(&lng)?))
}

fn at_coords(path: &str) -> Option<(f64, f64)> {
    let (_, rest) = path.split_once("/@")?;
    pair(rest)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn coords(u: &str) -> Option<(f64, f64)> {
        parse(u).unwrap().coords
    }

    #[test]
    fn every_common_form() {
        assert_eq!(
            coords(
                "https://www.google.com/maps/place/Burnside+Skatepark/@45.5229,-122.6643,17z/data=!3m1!4b1"
            ),
            Some((45.5229, -122.6643))
        );
        assert_eq!(
            coords(
                "https://www.google.com/maps/place/X/@45.0,-122.0,17z/data=!3m1!4b1!4m6!3m5!1s0x0:0x0!8m2!3d45.5231!4d-122.6651"
            ),
            Some((45.5231, -122.6651))
        );
        assert_eq!(
            coords("https://maps.google.com/?q=39.9,-75.177"),
            Some((39.9, -75.177))
        );
        assert_eq!(
            coords("https://maps.google.com/maps?ll=39.9,-75.177&z=15"),
            Some((39.9, -75.177))
        );
        assert_eq!(
            coords("https://www.google.com/maps/search/?api=1&query=47.5951%2C-122.3316"),
            Some((47.5951, -122.3316))
        );
        assert_eq!(
            coords("https://maps.apple.com/?ll=37.7749,-122.4194&q=Spot"),
            Some((37.7749, -122.4194))
        );
        assert_eq!(
            coords("https://maps.apple.com/place?coordinate=34.0195,-118.4912&name=Venice"),
            Some((34.0195, -118.4912))
        );
        assert_eq!(coords("https://maps.apple.com/?q=Burnside"), None);
        assert_eq!(
            coords("https://www.google.co.uk/maps/@51.5,-0.12,15z"),
            Some((51.5, -0.12))
        );
    }

    #[test]
    fn short_links_and_refusals() {
        let s = parse("https://maps.app.goo.gl/AbCdEf123").unwrap();
        assert!(s.short && s.coords.is_none());
        assert!(parse("https://goo.gl/maps/xyz").unwrap().short);
        assert!(parse("https://maps.apple/p/abc").unwrap().short);
        assert_eq!(
            parse("https://evil.example.com/maps/@1,2"),
            Err(MapsError::NotMaps)
        );
        assert_eq!(parse("not a url"), Err(MapsError::NotUrl));
        assert_eq!(
            parse("https://maps.google.com/?q=91,10"),
            Err(MapsError::OutOfRange)
        );
        assert_eq!(
            parse("https://www.google.com/maps/@45,-181,3z"),
            Err(MapsError::OutOfRange)
        );
    }
}
